"""Recent removals, so a late echo of our own write cannot bring a deleted object back.

The operator feeds the responses of its writes into the view at once (a decision counts
before its watch event arrives). A response can land after the object's DELETED event:
removing the last finalizer deletes the object in the same update, for one. Without a
memory of the removal that response would put a ghost in the view, and a ghost Bound
device would hold its node's units until a restart. Used by `state.store`, `state.pods` and
`state.devices` (removed devices by uid, for the order ledger).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

DEFAULT_LIMIT = 10_000


def version(value: str | None) -> int:
    # resourceVersions are etcd revisions: opaque by contract, integers in practice.
    try:
        return int(value or 0)
    except ValueError:
        return 0


class Tombstones:
    """The last resourceVersion of each recently removed object, oldest forgotten first."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self._limit = limit
        self._versions: OrderedDict[Hashable, int] = OrderedDict()

    def bury(self, key: Hashable, resource_version: int) -> None:
        self._versions[key] = max(resource_version, self._versions.pop(key, 0))
        while len(self._versions) > self._limit:
            self._versions.popitem(last=False)

    def at(self, key: Hashable) -> int | None:
        """The version the key was removed at, while remembered."""
        return self._versions.get(key)

    def stale(self, key: Hashable, resource_version: str | None) -> bool:
        """True for a version no newer than the removal; a newer one is a new object and lifts the stone."""
        buried = self._versions.get(key)
        if buried is None:
            return False
        if version(resource_version) <= buried:
            return True
        del self._versions[key]
        return False
