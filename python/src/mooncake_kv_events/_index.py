"""The index a follower keeps of one publisher: which media each object is readable on, and
its dump as JSON lines, byte for byte what `kv-events mirror --dump` writes.

The index is dicts all the way down, backend -> tenant -> key -> media, the media of an object
a small int with one bit per medium (`cpu` 1, `disk` 2, any other the publisher names next):
no set per object, and per tenant a dict of bytes and ints only, which CPython's garbage
collector does not track. `Index.apply_events` applies a message's events as msgpack decoded them
(maps with bytes keys, `_wire.decode_batch`) without making an object per event."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

from ._errors import ProtocolError
from ._wire import Event, EventKind, rendered

__all__ = ["MAX_MEDIA", "Index", "Object", "dump_lines", "merged", "write_dump"]

Object = tuple[bytes, bytes, frozenset[str]]
"""(tenant, key, media) of one object: tenant and key are the master's bytes, media a
frozenset of names (`cpu`, `disk`)."""

# The media one index tells apart: a publisher that names more has those events skipped.
MAX_MEDIA = 64


class Index:
    """backend -> tenant -> key -> media bits, every name the master's bytes. Every entry is
    non-empty: an object readable nowhere, a tenant without objects or a backend without
    tenants is not kept."""

    __slots__ = ("backends", "bits", "names", "sets")

    def __init__(self) -> None:
        self.backends: dict[bytes, dict[bytes, dict[bytes, int]]] = {}
        # The bit of each medium, by its name as the wire's bytes; the names by bit.
        self.bits: dict[bytes, int] = {b"cpu": 1, b"disk": 2}
        self.names: list[str] = ["cpu", "disk"]
        self.sets: dict[int, frozenset[str]] = {}

    def medium_bit(self, medium: object) -> int:
        """The bit of a medium; a name not seen yet takes the next one. ProtocolError when it
        is not text, or one too many."""
        if type(medium) is not bytes:
            raise ProtocolError(f"a medium that is a {type(medium).__name__}, not a str")
        bit = self.bits.get(medium)
        if bit is not None:
            return bit
        try:
            name = medium.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("a medium that is not UTF-8") from None
        if len(self.names) >= MAX_MEDIA:
            raise ProtocolError(f"a medium {name!r}: more than {MAX_MEDIA} media named")
        bit = self.bits[medium] = 1 << len(self.names)
        self.names.append(name)
        return bit

    def media_of(self, bits: int) -> frozenset[str]:
        """The names of the media in `bits`."""
        media = self.sets.get(bits)
        if media is None:
            names = self.names
            media = self.sets[bits] = frozenset(n for i, n in enumerate(names) if bits >> i & 1)
        return media

    def apply_events(self, events: tuple[Any, ...]) -> int:
        """Applies a message's events as decoded (`_wire.decode_batch`), in order; returns how
        many it skipped because the index cannot take them: exactly those `_wire.event_of`
        refuses. `stored` and `removed` are idempotent per (backend, tenant, key, medium): a
        repeated stored, or a removed of something unknown, changes nothing."""
        backends = self.backends
        bits = self.bits
        medium_bit = self.medium_bit
        is_bytes = bytes
        kind_of = type
        skipped = 0
        last_backend: object = None
        tenants: dict[bytes, dict[bytes, int]] = {}
        for raw in events:
            # What is not the format raises KeyError (a field missing), TypeError (not a map,
            # a value of the wrong type, checked where it would enter the index) or
            # ValueError (not UTF-8, or a medium too many): the event is skipped alone. A
            # value that is already in the index was checked when it entered.
            try:
                backend = raw[b"backend_id"]
                if backend != last_backend:
                    found = backends.get(backend)
                    if found is None:
                        if kind_of(backend) is not is_bytes:
                            raise TypeError
                        backend.decode("utf-8")
                        found = {}  # kept in `backends` once it holds a tenant
                    tenants = found
                    last_backend = backend
                kind = raw[b"event_type"]
                tenant = raw[b"tenant_id"]
                if kind == b"stored":
                    key = raw[b"object_key"]
                    medium = raw[b"medium"]
                    bit = bits.get(medium)
                    if bit is None:
                        bit = medium_bit(medium)
                    objects = tenants.get(tenant)
                    if objects is None:
                        if kind_of(tenant) is not is_bytes or kind_of(key) is not is_bytes:
                            raise TypeError
                        if not tenants:
                            backends[backend] = tenants
                        tenants[tenant] = {key: bit}
                        continue
                    held = objects.get(key)
                    if held is None:
                        if kind_of(key) is not is_bytes:
                            raise TypeError
                        objects[key] = bit
                    else:
                        objects[key] = held | bit
                elif kind == b"removed":
                    key = raw[b"object_key"]
                    medium = raw[b"medium"]
                    bit = bits.get(medium)
                    if bit is None:
                        bit = medium_bit(medium)
                    objects = tenants.get(tenant)
                    held = None if objects is None else objects.get(key)
                    if held is None or objects is None:
                        if kind_of(tenant) is not is_bytes or kind_of(key) is not is_bytes:
                            raise TypeError
                        continue
                    held &= ~bit
                    if held:
                        objects[key] = held
                    else:
                        del objects[key]
                        if not objects:
                            del tenants[tenant]
                            if not tenants:
                                del backends[backend]
                elif kind == b"cleared":
                    if tenants.pop(tenant, None) is None:
                        if kind_of(tenant) is not is_bytes:
                            raise TypeError
                    elif not tenants:
                        del backends[backend]
                else:
                    raise TypeError
            except (KeyError, TypeError, ValueError):
                skipped += 1
        return skipped

    def apply(self, event: Event) -> None:
        """Applies one event, as `apply_events` does."""
        backend = event.backend.encode("utf-8")
        tenants = self.backends.get(backend)
        if event.kind is EventKind.CLEARED:
            if tenants is not None and tenants.pop(event.tenant, None) is not None:
                if not tenants:
                    del self.backends[backend]
            return
        if event.key is None or event.medium is None:
            raise ProtocolError(f"a {event.kind} event without a key or a medium")
        bit = self.medium_bit(event.medium.encode("utf-8"))
        objects = None if tenants is None else tenants.get(event.tenant)
        if event.kind is EventKind.STORED:
            if tenants is None:
                tenants = self.backends[backend] = {}
            if objects is None:
                objects = tenants[event.tenant] = {}
            objects[event.key] = objects.get(event.key, 0) | bit
            return
        held = None if objects is None else objects.get(event.key)
        if held is None or objects is None or tenants is None:
            return
        held &= ~bit
        if held:
            objects[event.key] = held
            return
        del objects[event.key]
        if not objects:
            del tenants[event.tenant]
            if not tenants:
                del self.backends[backend]

    def __len__(self) -> int:
        """The number of objects, per backend."""
        return sum(
            len(objects) for tenants in self.backends.values() for objects in tenants.values()
        )

    def get(self, tenant: bytes, key: bytes) -> frozenset[str]:
        """The media `key` of `tenant` is readable on, of every backend; empty when none."""
        found = 0
        for tenants in self.backends.values():
            objects = tenants.get(tenant)
            if objects is not None:
                found |= objects.get(key, 0)
        return self.media_of(found)

    def entries(self) -> Iterator[tuple[str, bytes, bytes, list[str]]]:
        """(backend, tenant, key, sorted media), in order."""
        for backend in sorted(self.backends):
            tenants = self.backends[backend]
            for tenant in sorted(tenants):
                objects = tenants[tenant]
                for key in sorted(objects):
                    yield backend.decode("utf-8"), tenant, key, sorted(self.media_of(objects[key]))

    def is_sound(self) -> bool:
        """Whether every entry is non-empty, every name bytes and every object on a medium:
        what the tests check after anything at all."""
        return all(
            type(backend) is bytes
            and tenants
            and all(
                type(tenant) is bytes
                and objects
                and all(
                    type(key) is bytes and type(bits) is int and bits > 0
                    for key, bits in objects.items()
                )
                for tenant, objects in tenants.items()
            )
            for backend, tenants in self.backends.items()
        )


def merged(indexes: Iterable[Index]) -> list[Object]:
    """The objects of `indexes` (of every backend), media merged, sorted by the bytes of tenant
    then key."""
    union: dict[tuple[bytes, bytes], frozenset[str]] = {}
    for index in indexes:
        media_of = index.media_of
        for tenants in index.backends.values():
            for tenant, objects in tenants.items():
                for key, bits in objects.items():
                    media = media_of(bits)
                    held = union.get((tenant, key))
                    union[(tenant, key)] = media if held is None else held | media
    return [(tenant, key, media) for (tenant, key), media in sorted(union.items())]


def dump_lines(objects: Iterable[Object]) -> Iterator[str]:
    """The JSON lines of `objects` (as `Follower.objects` gives them): {"key", "media",
    "tenant"} per object, compact, keys sorted, UTF-8 as is: as kv-events mirror writes
    them."""
    for tenant, key, media in objects:
        yield json.dumps(
            {"tenant": rendered(tenant), "key": rendered(key), "media": sorted(media)},
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
        )


def write_dump(path: str | os.PathLike[str], objects: Iterable[Object]) -> int:
    """Writes the dump of `objects` beside `path`, then renames it over: a reader never sees
    half of it. Returns the number of objects written."""
    path = os.fspath(path)
    count = 0
    with open(path + ".tmp", "w", encoding="utf-8") as out:
        for line in dump_lines(objects):
            out.write(line + "\n")
            count += 1
    os.replace(path + ".tmp", path)
    return count
