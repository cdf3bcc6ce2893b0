"""Decoding the wire format (docs/spec.md, sections 5 and 11): stream messages, their msgpack
payloads and events, and the replay socket's replies. Anything that is not the format raises
`Malformed`, which a follower counts and skips."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import msgpack

__all__ = [
    "END_OF_REPLAY",
    "MAX_TOPIC_BYTES",
    "Event",
    "Info",
    "Malformed",
    "decode_batch",
    "decode_info",
    "decode_map",
    "decode_message",
    "number",
    "parse_event",
    "rendered",
]

# The sequence frame that ends a replay: -1 as 8 signed big-endian bytes.
END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)
# The longest topic frame a publisher sends (kv_events_topic).
MAX_TOPIC_BYTES = 255


class Malformed(ValueError):
    """Something that is not the protocol: counted and skipped."""


class Event(NamedTuple):
    """The part of one event an index reads. Tenants and keys are the master's bytes (msgpack
    str and bin alike); `key` and `medium` are None for `cleared`, which empties every object
    of (`backend`, `tenant`)."""

    kind: str
    """`stored`, `removed` or `cleared`."""
    backend: str
    """The publisher's `backend_id`."""
    tenant: bytes
    key: bytes | None
    medium: str | None
    """`cpu` or `disk` (any text the publisher sends is kept)."""


class Info(NamedTuple):
    """What an `info` reply says of the publisher."""

    incarnation: int
    last_sequence: int
    oldest_sequence: int
    snapshots: bool
    backend_id: Any


def as_bytes(value: object, what: str) -> bytes:
    """Tenants and keys are msgpack str, or bin when not UTF-8: bytes either way."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes):
        return value
    raise Malformed(f"{what} is a {type(value).__name__}, not str or bin")


def unpack(payload: bytes, what: str) -> Any:
    """The msgpack value of `payload`; Malformed when it is not exactly one."""
    # raw=False: str arrives as str (valid UTF-8) and bin as bytes, never mistaken for text.
    # Map keys that are not str stay apart (and the event that has them is skipped alone).
    try:
        return msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several types for bytes that are not msgpack
        raise Malformed(f"{what} is not msgpack ({type(e).__name__}: {e})") from None


def decode_batch(payload: bytes) -> list[Any]:
    """The events of a payload `[timestamp_ms, [events], dp_rank]`, still as msgpack maps."""
    batch = unpack(payload, "the payload")
    if not (isinstance(batch, list) and len(batch) == 3 and isinstance(batch[1], list)):
        raise Malformed("the payload is not [timestamp_ms, [events], dp_rank]")
    return batch[1]


def decode_message(frames: Sequence[bytes]) -> tuple[int, list[Any]]:
    """(sequence, events) of a stream message: frames topic, sequence, payload. A heartbeat
    has no event."""
    if len(frames) != 3:
        raise Malformed(f"{len(frames)} frames, expected 3")
    topic, sequence, payload = frames
    if len(topic) > MAX_TOPIC_BYTES:
        raise Malformed(f"a topic of {len(topic)} bytes, expected at most {MAX_TOPIC_BYTES}")
    if len(sequence) != 8:
        raise Malformed(f"a sequence of {len(sequence)} bytes, expected 8")
    return int.from_bytes(sequence, "big"), decode_batch(payload)


def parse_event(raw: object) -> Event:
    """The Event of one event map; Malformed when it is not one."""
    if not isinstance(raw, dict):
        raise Malformed("an event is not a map")
    kind, backend = raw.get("event_type"), raw.get("backend_id")
    if not isinstance(backend, str):
        raise Malformed("an event without a str backend_id")
    tenant = as_bytes(raw.get("tenant_id"), "tenant_id")
    if kind == "cleared":
        return Event(kind, backend, tenant, None, None)
    if kind not in ("stored", "removed"):
        raise Malformed(f"an event_type {kind!r}")
    medium = raw.get("medium")
    if not isinstance(medium, str):
        raise Malformed(f"a {kind} event without a medium")
    return Event(kind, backend, tenant, as_bytes(raw.get("object_key"), "object_key"), medium)


def decode_map(body: bytes, what: str) -> dict[Any, Any]:
    """The msgpack map of a reply's body; Malformed when it is not one."""
    value = unpack(body, what)
    if not isinstance(value, dict):
        raise Malformed(f"{what} is not a map")
    return value


def number(fields: dict[Any, Any], name: str, what: str) -> int:
    """The unsigned integer `fields[name]`; Malformed when there is none."""
    value = fields.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise Malformed(f"{what} has no {name}")
    return value


def decode_info(body: bytes) -> Info:
    """The body of an `info` reply."""
    info = decode_map(body, "an info reply")
    return Info(
        incarnation=number(info, "incarnation", "an info reply"),
        last_sequence=number(info, "last_sequence", "an info reply"),
        oldest_sequence=number(info, "oldest_sequence", "an info reply"),
        snapshots=info.get("snapshots") is True,
        backend_id=info.get("backend_id"),
    )


def rendered(value: bytes) -> str | dict[str, str]:
    """A tenant or key for JSON: the text when it is UTF-8, else {"hex": its bytes}."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return {"hex": value.hex()}
