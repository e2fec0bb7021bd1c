"""One kind's objects by key, with the resourceVersion of each and the recently removed.

Callers: `state.cluster` holds one `Store` per kind the view holds (pods keep their own,
`state.pods`, to the same `Versioned` contract) and asks it whether an event is news
before any index moves: not older than what is stored, not the late echo of a removal
(`tombstones`). The resync (runtime.watching.resync) reads what is held through `Versioned`
alone, the same way for every kind.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, Generic, Protocol, TypeVar

from cozygpu.state.tombstones import DEFAULT_LIMIT, Tombstones, version

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
F = TypeVar("F", bound=Callable[..., Any])


def writes(method: F) -> F:
    """Marks a method that changes the view: none may be reachable from `Cluster`'s public surface (only the
    door calls them, through `state.indexers`, the write side); tests/unit/test_layout.py walks it to check."""
    method.__writes__ = True  # type: ignore[attr-defined]
    return method


class ReadOnly(Mapping[K, V]):
    """A part's read side that is also its objects by key (`Cluster.devices`, `.budgets`, `.vmis`): a read-only
    mapping over the part's store, with the part's reads beside it."""

    def __init__(self, items: Mapping[K, V]) -> None:
        self._items = items

    def __getitem__(self, key: K) -> V:
        return self._items[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


class Versioned(Protocol):
    """What a resync needs of a kind's store: the version held per key, and what a list lacks."""

    def version(self, key: Any) -> int | None: ...

    def missing(self, listed: set[Any], list_version: str | None) -> list[Any]: ...


class Store(Generic[K, V]):
    """Objects (or what the view keeps of them) by key, each with its version; removals leave a tombstone."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self._items: dict[K, V] = {}
        self._versions: dict[K, int] = {}
        self._gone = Tombstones(limit)
        # Read-only for everyone outside the view: writes go through `put` and `pop`.
        self.items: Mapping[K, V] = MappingProxyType(self._items)

    @writes  # a newer version lifts a tombstone
    def news(self, key: K, resource_version: str | None) -> bool:
        """Whether an event of this version may be stored: no echo of a removal, not older than what is held."""
        if self._gone.stale(key, resource_version):
            return False
        held = self._versions.get(key)
        return held is None or version(resource_version) >= held

    @writes
    def put(self, key: K, value: V, resource_version: str | None) -> V | None:
        """Store the value at its version; returns what it replaced."""
        old = self._items.get(key)
        self._items[key] = value
        self._versions[key] = version(resource_version)
        return old

    @writes
    def pop(self, key: K, removal: str | None = None) -> V | None:
        """Forget the key, leaving a tombstone at the removal's version (or the stored one, if newer)."""
        old = self._items.pop(key, None)
        self._gone.bury(key, max(version(removal), self._versions.pop(key, 0)))
        return old

    def get(self, key: K) -> V | None:
        return self._items.get(key)

    def version(self, key: K) -> int | None:
        return self._versions.get(key)

    def missing(self, listed: Iterable[K], list_version: str | None) -> list[K]:
        """Keys held here that a list at `list_version` lacks, stored at a version no newer: removed while no watch
        event could say so (a start-up race between two lists, a watch gap). What is newer arrived after the list."""
        limit, seen = version(list_version), set(listed)
        return sorted((k for k, v in self._versions.items() if k not in seen and v <= limit), key=str)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)
