"""Decoding the wire format (docs/spec.md, sections 5 and 11): stream messages, their msgpack
payloads and events, and the replay socket's replies. Anything that is not the format raises
`ProtocolError`, which a follower counts and skips.

Payloads are decoded with `raw=True` and `use_list=False`: every msgpack str and bin arrives
as bytes (tenants, keys and groups are the master's bytes either way, and nothing is decoded
as UTF-8 that the index does not need as text) and arrays as tuples, the cheapest form
msgpack-python builds. Event maps therefore have bytes keys (`b"object_key"`)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, NamedTuple

import msgpack

from ._errors import ProtocolError

__all__ = [
    "END_OF_REPLAY",
    "MAX_TOPIC_BYTES",
    "Event",
    "EventKind",
    "Info",
    "decode_batch",
    "decode_info",
    "decode_map",
    "decode_message",
    "event_of",
    "number",
    "rendered",
    "text",
]

# The sequence frame that ends a replay: -1 as 8 signed big-endian bytes.
END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)
# The longest topic frame a publisher sends (kv_events_topic).
MAX_TOPIC_BYTES = 255


class EventKind(str, enum.Enum):
    """An event's `event_type`. A `str` too: `kind == "stored"` holds."""

    STORED = "stored"
    """The object is readable on `medium` now."""
    REMOVED = "removed"
    """The object is no longer readable on `medium`."""
    CLEARED = "cleared"
    """Every object of (`backend`, `tenant`) is gone."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


_KINDS = {b"stored": EventKind.STORED, b"removed": EventKind.REMOVED, b"cleared": EventKind.CLEARED}


class Event(NamedTuple):
    """One event as the publisher sent it (docs/spec.md, section 5), every field of the wire.

    Tenants, keys and groups are the master's bytes (msgpack str and bin alike). Fields the
    publisher leaves out, or sends nil, are None; the legacy fields (`type`, `block_hashes`,
    `parent_block_hash`) repeat `kind`, `seq_hashes` and `parent_hash` and are not kept apart.
    """

    kind: EventKind
    """`stored`, `removed` or `cleared` (`event_type`)."""
    backend: str
    """The publisher's store (`backend_id`)."""
    tenant: bytes
    """`tenant_id`: never empty (the master's empty tenant is `default`)."""
    key: bytes | None
    """`object_key`; None for `cleared`."""
    medium: str | None
    """`cpu` or `disk` (any text the publisher sends is kept); None for `cleared`."""
    event_id: int | None = None
    """1 for the first event a publisher encodes, then one more per event, with no gap."""
    timestamp: int | None = None
    """When its batch was encoded, Unix milliseconds."""
    model_name: str | None = None
    """The master's model name; None when it sets none."""
    block_size: int | None = None
    """The master's block size; None when 0."""
    lora_name: str | None = None
    additional_salt: Any = None
    """As received (a str or bin as bytes); None when not set."""
    dp_rank: int | None = None
    """The publisher's data-parallel rank."""
    group_id: bytes | None = None
    """The object's group, as the master's bytes; None when it has none, and for `cleared`."""
    seq_hashes: tuple[Any, ...] = ()
    """Always empty from a Mooncake master: the key is the identity."""
    base_block_idx: int | None = None
    token_ids: tuple[Any, ...] | None = None
    """`stored` only; None from a Mooncake master."""
    parent_hash: Any = None
    """`stored` only; None from a Mooncake master."""


class Info(NamedTuple):
    """What an `info` reply says of the publisher."""

    incarnation: int
    next_sequence: int
    """The sequence its next message takes: every number below it was taken, by a message or
    by events it dropped; 0 before any (the first message is 0)."""
    oldest_sequence: int
    """The oldest sequence a replay can send now; `next_sequence` when it holds none."""
    snapshots: bool
    backend_id: Any


def unpack(payload: bytes, what: str) -> Any:
    """The msgpack value of a payload; ProtocolError when it is not exactly one."""
    # strict_map_key=False: a map key that is not a string stays apart, and only the event
    # that has it is skipped.
    try:
        return msgpack.unpackb(payload, raw=True, use_list=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several types for bytes that are not msgpack
        raise ProtocolError(f"{what} is not msgpack ({type(e).__name__}: {e})") from None


def decode_batch(payload: bytes) -> tuple[Any, ...]:
    """The events of a payload `[timestamp_ms, [events], dp_rank]`, still as msgpack maps."""
    batch = unpack(payload, "the payload")
    if type(batch) is not tuple or len(batch) != 3 or type(batch[1]) is not tuple:
        raise ProtocolError("the payload is not [timestamp_ms, [events], dp_rank]")
    events: tuple[Any, ...] = batch[1]
    return events


def decode_message(frames: Sequence[bytes]) -> tuple[int, tuple[Any, ...]]:
    """(sequence, events) of a stream message: frames topic, sequence, payload. A heartbeat
    has no event."""
    if len(frames) != 3:
        raise ProtocolError(f"{len(frames)} frames, expected 3")
    topic, sequence, payload = frames
    if len(topic) > MAX_TOPIC_BYTES:
        raise ProtocolError(f"a topic of {len(topic)} bytes, expected at most {MAX_TOPIC_BYTES}")
    if len(sequence) != 8:
        raise ProtocolError(f"a sequence of {len(sequence)} bytes, expected 8")
    return int.from_bytes(sequence, "big"), decode_batch(payload)


def text(value: object, what: str) -> str:
    """A msgpack str (bytes here, raw) as text; ProtocolError when it is not UTF-8."""
    if type(value) is not bytes:
        raise ProtocolError(f"{what} is a {type(value).__name__}, not a str")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(f"{what} is not UTF-8") from None


def _optional(value: object, kind: type) -> Any:
    """`value` when it is of type `kind`, else None: the fields an index does not read are
    never a reason to skip an event."""
    return value if type(value) is kind else None


def _text_or_none(value: object) -> str | None:
    """A text field an index does not read: its text, or None when it is not UTF-8 text."""
    if type(value) is not bytes:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


def event_of(raw: object) -> Event:
    """The Event of one event map; ProtocolError, saying why, when an index cannot take it.
    The index's own path (`Index.apply_events`) takes and refuses exactly the same events."""
    if type(raw) is not dict:
        raise ProtocolError("an event is not a map")
    kind_field = raw.get(b"event_type")
    kind = _KINDS.get(kind_field) if type(kind_field) is bytes else None
    if kind is None:
        raise ProtocolError(f"an event_type {kind_field!r}")
    backend = text(raw.get(b"backend_id"), "backend_id")
    tenant = raw.get(b"tenant_id")
    if type(tenant) is not bytes:
        raise ProtocolError(f"tenant_id is a {type(tenant).__name__}, not str or bin")
    key: bytes | None = None
    medium: str | None = None
    if kind is not EventKind.CLEARED:
        key = raw.get(b"object_key")
        if type(key) is not bytes:
            raise ProtocolError(f"a {kind} event whose object_key is a {type(key).__name__}")
        if b"medium" not in raw or raw[b"medium"] is None:
            raise ProtocolError(f"a {kind} event without a medium")
        medium = text(raw[b"medium"], "medium")
    get = raw.get
    model_name, lora_name = get(b"model_name"), get(b"lora_name")
    token_ids = get(b"token_ids")
    return Event(
        kind,
        backend,
        tenant,
        key,
        medium,
        event_id=_optional(get(b"event_id"), int),
        timestamp=_optional(get(b"timestamp"), int),
        model_name=_text_or_none(model_name),
        block_size=_optional(get(b"block_size"), int),
        lora_name=_text_or_none(lora_name),
        additional_salt=get(b"additional_salt"),
        dp_rank=_optional(get(b"dp_rank"), int),
        group_id=_optional(get(b"group_id"), bytes),
        seq_hashes=_optional(get(b"seq_hashes"), tuple) or (),
        base_block_idx=_optional(get(b"base_block_idx"), int),
        token_ids=_optional(token_ids, tuple),
        parent_hash=get(b"parent_hash"),
    )


def decode_map(body: bytes, what: str) -> dict[str, Any]:
    """The msgpack map of a reply's body, its keys as text; ProtocolError when it is not
    one."""
    value = unpack(body, what)
    if type(value) is not dict:
        raise ProtocolError(f"{what} is not a map")
    fields: dict[str, Any] = {}
    for key, field in value.items():
        if type(key) is bytes:
            fields[key.decode("utf-8", "replace")] = field
    return fields


def number(fields: dict[str, Any], name: str, what: str) -> int:
    """The unsigned integer `fields[name]`; ProtocolError when there is none."""
    value = fields.get(name)
    if type(value) is not int or value < 0:
        raise ProtocolError(f"{what} has no {name}")
    return value


def decode_info(body: bytes) -> Info:
    """The body of an `info` reply."""
    info = decode_map(body, "an info reply")
    backend = info.get("backend_id")
    return Info(
        incarnation=number(info, "incarnation", "an info reply"),
        next_sequence=number(info, "next_sequence", "an info reply"),
        oldest_sequence=number(info, "oldest_sequence", "an info reply"),
        snapshots=info.get("snapshots") is True,
        backend_id=backend.decode("utf-8", "replace") if type(backend) is bytes else backend,
    )


def rendered(value: bytes) -> str | dict[str, str]:
    """A tenant or key for JSON: the text when it is UTF-8, else {"hex": its bytes}."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return {"hex": value.hex()}
