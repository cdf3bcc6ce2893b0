"""The exceptions the package raises: one base, `KvEventsError`, to catch them all. The native
module raises these too (it imports this module by name)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._follower import Status

__all__ = ["KvEventsError", "ProtocolError", "Refused", "Unreachable"]


class KvEventsError(Exception):
    """The base of every error this package raises of its own (a wrong argument is still a
    `TypeError` or a `ValueError`, as Python's own functions raise them): a follower used
    after `close`, a key file that cannot be read, an endpoint libzmq refuses."""


class ProtocolError(KvEventsError, ValueError):
    """Bytes that are not the protocol (docs/spec.md): a payload that `on_event` cannot
    decode. A follower counts what a publisher sends wrong and skips it, so this is never
    raised out of `poll` or `run`."""


class Refused(KvEventsError):
    """An upstream refused this follower's handshake, or its handshake cannot succeed (CURVE
    on one side only, the wrong server key, a key not on its allow-list)."""

    def __init__(self, upstream: str, reason: str) -> None:
        super().__init__(f"{upstream}: {reason}")
        self.upstream = upstream
        """The endpoint of the upstream that refused."""
        self.reason = reason
        """Why, in words."""


class Unreachable(KvEventsError):
    """`run(idle_timeout=...)` ended and no upstream was ever heard from. `statuses` says,
    per upstream, what is known."""

    def __init__(self, statuses: list[Status], reason: str) -> None:
        super().__init__(reason)
        self.statuses = statuses
        """The `Status` of each upstream when the run ended."""
