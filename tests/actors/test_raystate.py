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


def test_a_head_is_gone_only_when_its_gcs_port_refuses_every_try(monkeypatch):
    import socket
    import types

    import ray

    def joined(address):
        context = types.SimpleNamespace(gcs_address=address)
        monkeypatch.setattr(ray, "get_runtime_context", lambda: context)

    tries = []
    real = socket.create_connection
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: tries.append(a[0]) or real(*a, **k))
    for family, host, shown in ((socket.AF_INET, "127.0.0.1", "127.0.0.1"), (socket.AF_INET6, "::1", "[::1]")):
        with socket.socket(family) as head:
            head.bind((host, 0))
            head.listen()
            port = head.getsockname()[1]
            joined(f"{shown}:{port}")  # Ray writes IPv6 hosts in brackets
            assert not raystate.cluster_gone(tries=2)
        tries.clear()
        assert raystate.cluster_gone(tries=2) and tries == [(host, port)] * 2  # its port closed
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: (_ for _ in ()).throw(OSError(24, "EMFILE")))
    assert not raystate.cluster_gone(tries=2)  # no free descriptor here says nothing of the head
