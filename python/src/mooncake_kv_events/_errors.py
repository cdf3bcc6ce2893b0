"""The exceptions the package raises: one base, `KvEventsError`, to catch them all."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._links import Status

__all__ = ["KvEventsError", "ProtocolError", "Refused", "Unreachable"]


class KvEventsError(Exception):
    """The base of every error this package raises of its own (a wrong argument is still a
    `TypeError` or a `ValueError`, as Python's own functions raise them)."""


class ProtocolError(KvEventsError, ValueError):
    """Something a publisher sent that is not the protocol (docs/spec.md): a follower counts
    it (`Counters.malformed`, `Counters.skipped_events`) and skips it, so it is raised only
    inside, never out of `poll` or `run`."""


class Refused(KvEventsError):
    """A publisher refused this follower's handshake, or its handshake cannot succeed (CURVE
    on one side only, the wrong server key, a key not on its allow-list)."""

    def __init__(self, publisher: str, reason: str) -> None:
        super().__init__(f"{publisher}: {reason}")
        self.publisher = publisher
        """The PUB endpoint of the publisher that refused."""
        self.reason = reason
        """Why, in words."""


class Unreachable(KvEventsError):
    """`run(idle_timeout=...)` ended and no publisher was ever reached: nothing accepted a
    connection, or no ZeroMQ handshake completed. `statuses` says, per publisher, why."""

    def __init__(self, statuses: list[Status], reason: str) -> None:
        super().__init__(reason)
        self.statuses = statuses
        """The `Status` of each publisher when the run ended."""
