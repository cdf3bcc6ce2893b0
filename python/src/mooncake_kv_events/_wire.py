"""Decoding a stream message's payload into `Event`s (docs/spec.md, section 5), for
`on_event`: the native follower applies every message itself and hands the payloads of those
it applied to Python only when a callback wants their events. Anything that is not the format
raises `ProtocolError`.

Payloads are decoded with `raw=True` and `use_list=False`: every msgpack str and bin arrives
as bytes (tenants, keys and groups are the master's bytes either way, and nothing is decoded
as UTF-8 that the index does not need as text) and arrays as tuples, the cheapest form
msgpack-python builds. Event maps therefore have bytes keys (`b"object_key"`)."""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

import msgpack

from ._errors import ProtocolError

__all__ = ["Event", "EventKind", "decode_batch", "event_of", "events_of"]


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
    """The Event of one event map; ProtocolError, saying why, when an index cannot take it
    (as the native index refuses it: `events_of` passes on the events it applied)."""
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


def events_of(payload: bytes) -> list[Event]:
    """The events of an applied message's payload that an index takes, in order (the native
    follower skipped and counted the others: `FollowerCounters.skipped_events`)."""
    events = []
    for raw in decode_batch(payload):
        try:
            events.append(event_of(raw))
        except ProtocolError:
            continue
    return events
