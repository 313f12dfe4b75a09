"""A server-in-the-loop round: the policy's driver talks to one session per selected client.

Some algorithms need the server inside the local round (split learning: per iteration the
workers' features go up, the server steps the top model, the gradients come down). The policy
then opens a `RoundDriver` for the round (`capabilities.DrivesRounds.open_driver`) and the client procedure
opens a `ClientSession` per task (`ClientProcedure.open_session`). The executors know nothing
of what is exchanged: they open one session per task (pinned to one host for the round), relay
the driver's calls to the sessions in order through a `Relay`, and close the sessions, whose
`ClientResult`s the engine records and aggregates like any other round's. Values crossing a relay
are plain data (numpy arrays, numbers), since sessions may live in other processes.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence, TypeVar

from .messages import ClientResult, ServerState

T = TypeVar("T")


class Relay(Protocol):
    """The driver's line to the round's sessions, one per task in client-id order."""

    def call(self, method: str, args: Sequence[tuple] | None = None) -> list[Any]:
        """`session.method(*args[i])` on every session i; waits and returns their replies."""

    def post(self, method: str, args: Sequence[tuple] | None = None) -> None:
        """The same without waiting: each session runs it before its next call (errors surface then)."""


class RoundDriver:
    """Server half of a server-in-the-loop round."""

    def drive(self, clients: Relay) -> None:
        """The round's exchange with the sessions (they are open; the executor closes them)."""
        raise NotImplementedError

    def finish(self, state: ServerState) -> ServerState:
        """The state with the server side's training folded in, before the policy aggregates
        the clients' results (split learning: the trained top model)."""
        return state


class ClientSession:
    """Client half of a server-in-the-loop round: public methods the driver calls by name."""

    def close(self) -> ClientResult:
        raise NotImplementedError


def invoke(session: ClientSession, method: str, args: tuple = ()) -> Any:
    """`session.method(*args)`, for a public method only (what every relay, local or on Ray, runs)."""
    if method.startswith("_") or not callable(getattr(session, method, None)):
        raise ValueError(f"{type(session).__name__} has no session method {method!r}")
    return getattr(session, method)(*args)


def per_session(args: Sequence[tuple] | None, count: int, method: str) -> list[tuple]:
    """A relay's argument tuples, one per session (none: no arguments)."""
    if args is None:
        return [()] * count
    if len(args) != count:
        raise ValueError(f"{method}: {len(args)} argument tuples for {count} sessions")
    return list(args)


class SessionFailed(Exception):
    """A client session's call raised in this process: what a session's failed actor call
    (`RayTaskError`) is on Ray. It fails the round's sessions; an error of the driver itself (the
    server's side) is not one and ends the run, in process and on Ray alike."""


def client_side(call: Callable[..., T], *args: Any) -> T:
    """`call(*args)` on a session's side: its error becomes `SessionFailed` (one line)."""
    try:
        return call(*args)
    except Exception as exc:
        raise SessionFailed(f"{type(exc).__name__}: {exc}") from exc


class LocalRelay:
    """A relay to sessions held in this process (the in-process executor's)."""

    def __init__(self, sessions: Sequence[ClientSession]):
        self.sessions = list(sessions)

    def call(self, method: str, args: Sequence[tuple] | None = None) -> list[Any]:
        return [
            client_side(invoke, s, method, a)
            for s, a in zip(self.sessions, per_session(args, len(self.sessions), method))
        ]

    def post(self, method: str, args: Sequence[tuple] | None = None) -> None:
        self.call(method, args)
