"""Reads of Ray's private state (actors/raystate.py): a read that fails is unknown, never dead."""

import ray._private.state

from actors import raystate


class Handle:
    class _actor_id:  # noqa: N801 - the shape of an ActorHandle's private id
        @staticmethod
        def hex():
            return "ab" * 16


def test_a_failed_read_never_ends_a_live_borrower_and_never_lends_an_unknown_actor(monkeypatch):
    def busy(actor_id=None):
        raise ConnectionError("the GCS is restarting")

    monkeypatch.setattr(ray._private.state, "actors", busy)
    assert raystate.actor("ab" * 16) is None
    assert raystate.running("ab" * 16)  # its lease kept: asked again next second
    assert not raystate.fresh(Handle()) and raystate.placed(Handle()) is None and raystate.waiting(Handle()) is None


def test_an_answer_is_read_as_it_is(monkeypatch):
    table = {"ab" * 16: {"State": "DEAD", "Pid": 7, "NumRestarts": 0}}
    monkeypatch.setattr(ray._private.state, "actors", lambda actor_id=None: table.get(actor_id, {}))
    assert not raystate.running("ab" * 16) and raystate.placed(Handle()) and not raystate.fresh(Handle())
    table["ab" * 16] = {"State": "PENDING_CREATION", "Pid": 0}
    assert (
        raystate.placed(Handle()) is False
        and raystate.waiting(Handle())
        and raystate.running("ab" * 16)
        and not raystate.running("cd" * 16)
    )
