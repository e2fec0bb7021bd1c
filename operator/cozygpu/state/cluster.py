"""The in-memory cluster view's read side: what workers and decisions get, grouped by part.

`Cluster` holds one store per kind and the parts (`state.devices`, `state.capacity`, `state.budgets`,
`state.pods` with `state.unmanaged`, `state.vmis`), and hands each part out read-only: `devices`, `capacity`,
`budgets`, `pods`, `vmis`, beside the kinds no part indexes (`classes`, `gpunodes`, `namespaces`, `kubevirts`)
and the few reads that join parts. tests/unit/test_layout.py walks this surface: nothing on it writes.

Its write side is `state.indexers.Indexers`, which runtime.view (the door) alone holds: watch events, resync
lists, the responses of our own writes, fresh reads, and the binder's decisions in flight all change the
parts through it, as kopf's `OperatorIndexers` fill the `OperatorIndices` handlers read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from cozygpu.api import GPUClass, GPUNode, kinds
from cozygpu.api.kinds import VIEWED, Kind
from cozygpu.api.kubevirt import KubeVirtConfig
from cozygpu.state.budgets import BudgetIndex, BudgetReads
from cozygpu.state.capacity import Capacity, CapacityReads
from cozygpu.state.change import Assumption, Change, DeviceKey
from cozygpu.state.devices import DeviceReads, Devices, Turn
from cozygpu.state.pods import PodReads, PodUsage
from cozygpu.state.store import Store, Versioned
from cozygpu.state.tombstones import DEFAULT_LIMIT, version
from cozygpu.state.unmanaged import Unmanaged
from cozygpu.state.vmis import VmiReads, Vmis

__all__ = ["KINDS", "Assumption", "Change", "Cluster", "DeviceKey", "Turn"]

# Every kind the view holds.
KINDS: tuple[Kind, ...] = VIEWED


class Cluster:
    """Every object the decisions need, kept current from events by the door; read-only here."""

    def __init__(self, tombstones: int = DEFAULT_LIMIT, clock: Callable[[], float] = time.monotonic) -> None:
        """`clock`: seconds, for how long a device has been idle (§5.7)."""
        self._classes: Store[str, GPUClass] = Store(tombstones)
        self._devices = Devices(tombstones)
        self._capacity = Capacity(self._classes.items, tombstones, clock)
        self._budgets = BudgetIndex(tombstones)  # budgets with what each covers and the use under each (§7)
        self._gpunodes: Store[str, GPUNode] = Store(tombstones)
        self._namespaces: Store[str, dict[str, str]] = Store(tombstones)  # their labels
        # KubeVirt CRs: the resource names each permits (§1.5) and the cluster's eviction strategy (§6.8).
        self._kubevirts: Store[DeviceKey, KubeVirtConfig] = Store(tombstones)
        self._vmis = Vmis(self._devices.attached_to, tombstones)
        self._pods = PodUsage(tombstones)  # units pods hold per node: those the operator did not place (§1.3)
        self._unmanaged = Unmanaged(self._pods, self._capacity, self._classes.items, self._vmis.set_of)
        # Nodes that devices name but the view does not have (§5.6), kept as both change.
        self._gone_nodes: set[str] = set()
        # Per kind, the version through which the watch has delivered every event (a list's, then each event's).
        self._progress: dict[Kind, int] = {}
        # Per kind, where the view keeps it (for resyncs, §6.4).
        self._stores: dict[Kind, Versioned] = {
            kinds.GPU_CLASS: self._classes,
            kinds.GPU_DEVICE: self._devices.store,
            kinds.GPU_BUDGET: self._budgets.store,
            kinds.GPU_NODE: self._gpunodes,
            kinds.NODE: self._capacity.nodes,
            kinds.NAMESPACE: self._namespaces,
            kinds.KUBEVIRT: self._kubevirts,
            kinds.VMI: self._vmis.store,
            kinds.POD: self._pods,
        }
        assert set(self._stores) == set(KINDS)
        # The read side, grouped by part.
        self.devices = DeviceReads(self._devices)
        self.capacity = CapacityReads(self._capacity)
        self.budgets = BudgetReads(self._budgets, self._namespaces.items, self.namespace_labels)
        self.pods = PodReads(self._pods, self._unmanaged.on)
        self.vmis = VmiReads(self._vmis)
        # And the kinds no part indexes.
        self.classes = self._classes.items
        self.gpunodes = self._gpunodes.items
        self.namespaces = self._namespaces.items
        self.kubevirts = self._kubevirts.items

    # -- reads that join the parts ---------------------------------------------------------

    def progress(self, kind: Kind) -> int:
        """The version through which the view has every watch event of `kind` (0 before its first list). What the
        writer put in from our own writes may be newer; what other writers did after it may be missing."""
        return self._progress.get(kind, 0)

    def gone_nodes(self) -> list[str]:
        """Nodes that some device names but the view does not have, sorted."""
        return sorted(self._gone_nodes)

    def namespace_labels(self, namespace: str) -> dict[str, str]:
        # Every namespace carries kubernetes.io/metadata.name; keep selectors on it working
        # even before the namespace's own event arrives.
        return {"kubernetes.io/metadata.name": namespace, **self.namespaces.get(namespace, {})}

    # -- what a resync asks (§6.4): the same for every kind --------------------------------

    def stored_version(self, kind: Kind, key: Any) -> int | None:
        """The version of the object of this kind and key the view holds, None if it holds none."""
        return self._stores[kind].version(key)

    def holds(self, kind: Kind, key: Any, resource_version: str | None) -> bool:
        """Whether the view already holds this object at exactly this version: a resync skips it unread."""
        held = self._stores[kind].version(key)
        return held is not None and held == version(resource_version)

    def knows(self, kind: Kind, key: Any) -> bool:
        """Whether the view holds an object of this kind and key, at any version."""
        return self._stores[kind].version(key) is not None

    def missing(self, kind: Kind, listed: Iterable[Any], list_version: str | None) -> list[Any]:
        """Keys of `kind` the view holds that a list at `list_version` lacks, stored at a version no newer.

        Such an object was removed while no watch event could say so (the start-up race between two
        lists, a watch gap); what is newer than the list arrived after it and stays."""
        return self._stores[kind].missing(set(listed), list_version)
