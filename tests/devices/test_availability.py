"""Availability on the virtual clock and a changing population, against numbers derived by hand."""

import math

import numpy as np
import pytest

from rayfl.config import ConfigError, DiurnalAvailability, PopulationConfig
from rayfl.devices.availability import Diurnal, TraceWindows
from rayfl.devices.churn import Churn

DAY = dict(kind="diurnal", on_fraction=0.3, session_s=1800.0, amplitude=0.8, slot_s=300.0)


def test_diurnal_availability_matches_its_on_fraction_and_session_length():
    # 10^5 draws: 1,000 devices at 100 times spread over two days. p_d(t) averages to f over
    # the uniform phases, so the share online is f = 0.3 whatever the time.
    d = Diurnal(DiurnalAvailability(**DAY), 1000, seed=0)
    times = np.sort(np.random.default_rng(1).uniform(0, 2 * 86400, 100))
    share = np.mean([d.online(0, t).mean() for t in times])
    assert share == pytest.approx(0.3, abs=0.01)
    # The day curve: devices at their peak (phase near the time of day) are online about
    # f (1 + a) = 0.54 of the time, those at their trough f (1 - a) = 0.06.
    t = 86400 * 1.5
    on = np.array([d.online(0, t + k * 300) for k in range(12)]).mean(0)
    offset = np.cos(2 * np.pi * (t / 86400 - d.phase))
    assert on[offset > 0.95].mean() == pytest.approx(0.54, abs=0.05) and on[offset < -0.95].mean() == pytest.approx(
        0.06, abs=0.03
    )
    # Sessions are geometric in slots with mean session_s.
    dev, start, end = Diurnal(DiurnalAvailability(**DAY), 1000, seed=0).sessions(4 * 86400)
    inside = end < 4 * 86400  # sessions cut by the span's end are shorter
    assert np.mean(end[inside] - start[inside]) == pytest.approx(1800, rel=0.03)
    assert np.all((start % 300 == 0) & (end > start))


def test_diurnal_answers_do_not_depend_on_the_order_of_questions():
    a, b = (Diurnal(DiurnalAvailability(**DAY), 500, seed=3) for _ in range(2))
    late = a.online(0, 50000.0).copy()
    a.online(0, 100.0)  # going back recomputes from time 0
    assert np.array_equal(late, b.online(0, 50000.0)) and np.array_equal(a.online(0, 50000.0), late)
    c = int(np.flatnonzero(late)[0])
    assert a.since(c, 0, 50000.0) <= 50000.0 < a.until(c, 0, 50000.0)


def test_a_day_cycle_too_steep_for_its_sessions_is_refused():
    # With 6-hour sessions the chain cannot follow a share that falls from 0.57 to 0.03 in a
    # day: the devices online stay online longer than the curve allows (r_d < 0).
    with pytest.raises(ConfigError, match="session"):
        Diurnal(DiurnalAvailability(**{**DAY, "session_s": 6 * 3600, "amplitude": 0.9}), 10, seed=0)


def test_trace_windows_repeat_every_period_and_give_the_interval_ends():
    # Device 0: online [10, 20) and [30, 40), period 50; device 1: [0, 5), period 100.
    w = TraceWindows(
        np.array([0, 1, 0]),
        (np.array([0, 0, 1]), np.array([30.0, 10.0, 0.0]), np.array([40.0, 20.0, 5.0])),
        np.array([50.0, 100.0]),
    )
    assert w.online(0, 15.0).tolist() == [True, False, True]
    assert w.online(0, 63.0).tolist() == [True, False, True]  # 63 mod 50 = 13
    assert w.online(0, 102.0).tolist() == [False, True, False]  # device 1: 102 mod 100 = 2
    assert (w.until(0, 0, 63.0), w.since(0, 0, 63.0)) == (70.0, 60.0)
    assert w.until(1, 0, 102.0) == 105.0


def test_arrivals_take_new_ids_and_departures_remove_present_clients():
    cfg = PopulationConfig(initial=100, arrivals_per_hour=360, departures_per_hour=180)
    churn = Churn(cfg, 2000, seed=0)
    # Arrivals: a Poisson process at 0.1 per second; the k-th arrival is client 100 + k.
    gaps = np.diff(churn.arrived_at[100:])
    assert np.all(gaps >= 0) and np.mean(gaps) == pytest.approx(10, rel=0.1)
    assert churn.size(0) == 100 and churn.present(0).tolist() == [True] * 100 + [False] * 1900
    # After an hour: about 360 arrived and 180 left (Poisson: sd 19 and 13).
    arrived = int(np.sum(churn.arrived_at <= 3600))
    left = int(np.sum(churn.departed_at <= 3600)) if churn.size(3600) else 0
    assert abs(arrived - 460) < 60 and abs(left - 180) < 45
    assert churn.size(3600) == arrived - left == int(churn.present(3600).sum())
    # A departed client left after it arrived and never comes back.
    gone = np.flatnonzero(churn.departed_at <= 3600)
    assert np.all(churn.arrived_at[gone] < churn.departed_at[gone]) and not churn.present(7200)[gone].any()
    # The same seed gives the same population whatever was asked before.
    other = Churn(cfg, 2000, seed=0)
    assert other.leaves_at(int(gone[0]), 3600) == churn.departed_at[gone[0]]
    assert math.isinf(Churn(PopulationConfig(), 10, 0).leaves_at(3, 1e9))
