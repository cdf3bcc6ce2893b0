"""The index a follower keeps of one publisher: which media each object is readable on, and
its dump as JSON lines, byte for byte what `kv-events mirror --dump` writes."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator

from .wire import Event, rendered

__all__ = ["Index", "Object", "dump_lines", "merged", "write_dump"]

Object = tuple[bytes, bytes, frozenset[str]]
"""(tenant, key, media) of one object: tenant and key are the master's bytes."""


class Index:
    """(backend, tenant) -> {key: set of media}; tenants and keys are bytes. Every entry is
    non-empty: an object readable nowhere, or a tenant without objects, is not kept."""

    def __init__(self) -> None:
        self.tenants: dict[tuple[str, bytes], dict[bytes, set[str]]] = {}

    def apply(self, event: Event) -> None:
        """Applies one event. `stored` and `removed` are idempotent per (backend, tenant, key,
        medium): a repeated stored, or a removed of something unknown, changes nothing."""
        kind, backend, tenant, key, medium = event
        if kind == "cleared":
            self.tenants.pop((backend, tenant), None)
            return
        assert key is not None and medium is not None  # parse_event guarantees it
        objects = self.tenants.get((backend, tenant))
        if kind == "stored":
            if objects is None:
                objects = self.tenants[(backend, tenant)] = {}
            media = objects.get(key)
            if media is None:
                objects[key] = {medium}
            else:
                media.add(medium)
        elif objects is not None and key in objects:
            media = objects[key]
            media.discard(medium)
            if not media:
                del objects[key]
                if not objects:
                    del self.tenants[(backend, tenant)]

    def __len__(self) -> int:
        """The number of objects, per backend."""
        return sum(len(objects) for objects in self.tenants.values())

    def get(self, tenant: bytes, key: bytes) -> frozenset[str]:
        """The media `key` of `tenant` is readable on, of every backend; empty when none."""
        found: set[str] = set()
        for (_, t), objects in self.tenants.items():
            if t == tenant:
                found.update(objects.get(key, ()))
        return frozenset(found)

    def entries(self) -> Iterator[tuple[str, bytes, bytes, list[str]]]:
        """(backend, tenant, key, sorted media), in order."""
        for backend, tenant in sorted(self.tenants):
            objects = self.tenants[(backend, tenant)]
            for key in sorted(objects):
                yield backend, tenant, key, sorted(objects[key])


def merged(indexes: Iterable[Index]) -> list[Object]:
    """The objects of `indexes` (of every backend), media merged, sorted by the bytes of tenant
    then key."""
    union: dict[tuple[bytes, bytes], set[str]] = {}
    for index in indexes:
        for (_, tenant), objects in index.tenants.items():
            for key, media in objects.items():
                held = union.get((tenant, key))
                if held is None:
                    union[(tenant, key)] = set(media)
                else:
                    held.update(media)
    return [(tenant, key, frozenset(media)) for (tenant, key), media in sorted(union.items())]


def dump_lines(objects: Iterable[Object]) -> Iterator[str]:
    """The JSON lines of `objects` (as `merged` gives them): {"key", "media", "tenant"} per
    object, compact, keys sorted, UTF-8 as is: as kv-events mirror writes them."""
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
