"""The in-memory cluster view: a read-only façade over one store per kind and the indexes decisions read.

Workers and decisions get a `Cluster` and can only read it: its public surface is queries and
read-only mappings (tests/unit/test_layout.py walks it). Every change comes in through the door,
runtime.view, which alone calls the private `_apply`, `_assume` and `_settle` here: watch events,
resync lists, the responses of our own writes, fresh reads, and the binder's decisions in flight
(assumed: counted before their write returns, so no unit is spent twice, §13.1). Each says what
changed as a `Change`. An event older than what is stored is ignored, and so is the late echo of
a removal (`state.store`).

The parts: `state.devices` (devices, their indexes, the waiting room), `state.capacity` (nodes,
free units, best fit, serving), `state.budgets` (budgets, use per namespace), `state.pods` and
`state.unmanaged` (units pods hold, and those the operator did not place), `state.vmis` (VMIs'
uids and references), `state.store` (one per kind, with versions and tombstones).

Why one module: it is the façade every reader holds and the one place where an applied object is
counted in every part's index at once; the parts live in their own modules. Issue 35 item 2 splits
its read side from its write side.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from cozygpu.api import GPUBudget, GPUClass, GPUDevice, GPUNode, kinds
from cozygpu.api.kinds import VIEWED, Kind
from cozygpu.api.kubevirt import permitted_resources
from cozygpu.state.budgets import BudgetIndex
from cozygpu.state.capacity import Capacity
from cozygpu.state.change import Assumption, Change, DeviceKey
from cozygpu.state.devices import Devices, Turn
from cozygpu.state.nodes import node_info
from cozygpu.state.pods import PodUsage
from cozygpu.state.store import Store, Versioned
from cozygpu.state.tombstones import DEFAULT_LIMIT, version
from cozygpu.state.unmanaged import Unmanaged
from cozygpu.state.vmis import Vmis

__all__ = ["KINDS", "Assumption", "Change", "Cluster", "DeviceKey", "Turn"]

# Every kind the view holds.
KINDS: tuple[Kind, ...] = VIEWED


class Cluster:
    """Every object the decisions need, kept current from events; read-only outside runtime.view."""

    def __init__(self, tombstones: int = DEFAULT_LIMIT, clock: Callable[[], float] = time.monotonic) -> None:
        """`clock`: seconds, for how long a device has been idle (§5.7)."""
        self._classes: Store[str, GPUClass] = Store(tombstones)
        self._devices = Devices(tombstones)
        self._capacity = Capacity(self._classes.items, tombstones, clock)
        self._budgets = BudgetIndex(tombstones)  # budgets with what each covers and the use under each (§7)
        self._gpunodes: Store[str, GPUNode] = Store(tombstones)
        self._namespaces: Store[str, dict[str, str]] = Store(tombstones)  # their labels
        # KubeVirt CRs: the resource names each permits (§1.5); None: no table set.
        self._kubevirts: Store[DeviceKey, set[str] | None] = Store(tombstones)
        self._vmis = Vmis(self._devices.attached_to, tombstones)
        self._pods = PodUsage(tombstones)  # units pods hold per node: those the operator did not place (§1.3)
        self._unmanaged = Unmanaged(self._pods, self._capacity, self._classes.items, self._vmis.set_of)
        # Nodes that devices name but the view does not have (§5.6), kept as both change.
        self._gone_nodes: set[str] = set()
        # Decisions whose writes are in flight: the version each was decided on, and the assumption's token.
        self._assumed: dict[DeviceKey, tuple[int, int]] = {}
        self._assumptions = 0
        # Per kind, the version through which the watch has delivered every event (a list's, then each event's).
        self._progress: dict[Kind, int] = {}
        # What the change being applied touched; `_apply` hands it out as a `Change`.
        self._nodes_touched: set[str] = set()
        self._namespaces_touched: set[str] = set()
        self._all_nodes = False
        self._changed = False
        # Per kind, where the view keeps it (for resyncs, §6.4) and how an event stores or forgets it.
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
        self._writes: dict[Kind, tuple[Callable[[dict[str, Any]], object], Callable[[Any, str | None], None]]] = {
            kinds.GPU_DEVICE: (self._upsert_device, self._remove_device),
            kinds.GPU_CLASS: (self._upsert_class, self._remove_class),
            kinds.GPU_BUDGET: (self._upsert_budget, self._remove_budget),
            kinds.GPU_NODE: (self._upsert_gpunode, self._remove_gpunode),
            kinds.NODE: (self._upsert_node, self._remove_node),
            kinds.NAMESPACE: (self._upsert_namespace, self._remove_namespace),
            kinds.KUBEVIRT: (self._upsert_kubevirt, self._remove_kubevirt),
            kinds.VMI: (self._upsert_vmi, self._remove_vmi),
            kinds.POD: (self._upsert_pod, self._remove_pod),
        }
        assert set(self._writes) == set(self._stores) == set(KINDS)
        # The read-only surface: what each part answers, under the names decisions use.
        self.classes, self.devices, self.budgets = self._classes.items, self._devices.store.items, self._budgets.budgets
        self.nodes, self.gpunodes = self._capacity.nodes.items, self._gpunodes.items
        self.namespaces, self.kubevirts, self.vmis = self._namespaces.items, self._kubevirts.items, self._vmis.uids
        self.serving = self._capacity.serving
        d = self._devices
        self.device, self.device_removed, self.arrival, self.turn, self.devices_on, self.devices_in = (
            d.device,
            d.removed,
            d.arrival,
            d.turn,
            d.devices_on,
            d.devices_in,
        )
        self.held_by_class, self.named_by_open_request = d.held_by_class, d.named_by_open_request
        self.devices_of_request, self.attached_to, self.devices_of_class, self.waiting_since = (
            d.devices_of_request,
            d.attached_to,
            d.devices_of_class,
            d.waiting_since,
        )
        self.open_request_ids, self.unbound_in_turn, self.waiting, self.next_waiting, self.heads_waiting = (
            d.open_request_ids,
            d.unbound_in_turn,
            d.waiting,
            d.next_waiting,
            d.heads_waiting,
        )
        c = self._capacity
        self.held_of_class, self.held_units, self.unmanaged_units, self.taken_units = (
            c.held_of_class,
            c.held_units,
            c.unmanaged_units,
            c.taken_units,
        )
        self.best_fit, self.reach_fit, self.most_units, self.nodes_with, self.idle_for = (
            c.best_fit,
            c.reach_fit,
            c.most_units,
            c.nodes_with,
            c.idle_for,
        )
        self.idle_clock, self.turned_idle, self.next_idle = c.idle_clock, c.turned_idle, c.next_idle
        self.use_in, self.names_device, self.vmi_exists, self.set_of, self.vm_of = (
            self._budgets.use_in,
            self._vmis.names_device,
            self._vmis.vmi_exists,
            self._vmis.set_of,
            self._vmis.vm_of,
        )
        self.pod, self.pod_keys, self.pods_on, self.launchers_of, self.guest_running = (
            self._pods.get,
            self._pods.keys,
            self._pods.on,
            self._pods.launchers_of,
            self._pods.guest_running,
        )
        self.pods_holding, self.unmanaged_on = self._pods.__len__, self._unmanaged.on

    # -- the door's side: runtime.view alone calls these -----------------------------------

    def _apply(self, kind: Kind, body: dict[str, Any], *, deleted: bool = False) -> Change:
        """Store `body` (a watch event's object, a list item, a write's response), or forget it when
        `deleted` (its resourceVersion, if any, is the removal's); says what changed."""
        meta = body.get("metadata") or {}
        namespace, name = meta.get("namespace") or "", meta.get("name") or ""
        self._begin()
        upsert, remove = self._writes[kind]
        if deleted:
            remove(kind.key_of(body), meta.get("resourceVersion"))
        else:
            upsert(body)
        return self._change(kind, namespace, name, deleted)

    def _progressed(self, kind: Kind, resource_version: str) -> None:
        """The watch of `kind` delivered every event through this version (versions only rise)."""
        self._progress[kind] = max(self._progress.get(kind, 0), version(resource_version))

    def _assume(self, device: GPUDevice) -> Assumption:
        """Count a decision whose write is in flight (§13.1): stored now, and no event of the version it
        was decided on (a resync's list, a late echo) can undo it until `_settle` with the token returned."""
        key = device.key
        self._begin()
        self._assumptions += 1
        self._assumed[key] = (version(device.metadata.resource_version), self._assumptions)
        old = self._devices.store.get(key)
        if old is not None and old.holds_gpus and old.status.node_name != device.status.node_name:
            self._capacity.keep_origin(key)  # a move frees nothing until its write is settled (§13.1)
        self._store_device(key, device)
        return Assumption(self._assumptions, frozenset(self._capacity.take_room()[0]))

    def _settle(self, namespace: str, name: str, token: int) -> bool:
        """The write of assumption `token` is done (or failed): the API's answer, or a fresh read, counts from
        now on. False, and nothing changed, when the device carries another assumption than this one."""
        key = (namespace, name)
        if key not in self._assumed or self._assumed[key][1] != token:
            return False
        del self._assumed[key]
        return True

    def _begin(self) -> None:
        self._nodes_touched, self._namespaces_touched, self._all_nodes = set(), set(), False
        self._changed = False
        self._capacity.take_room()

    def _change(self, kind: Kind, namespace: str, name: str, deleted: bool) -> Change:
        room, served, reach = self._capacity.take_room()
        return Change(
            kind=kind,
            namespace=namespace,
            name=name,
            deleted=deleted,
            stored=self._changed,
            nodes=frozenset(self._nodes_touched),
            namespaces=frozenset(self._namespaces_touched),
            all_nodes=self._all_nodes,
            room=frozenset(room),
            served=frozenset(served),
            guests_gone=frozenset(self._pods.take_ended()),
            reach=frozenset(reach),
        )

    # -- devices -----------------------------------------------------------------------

    def _upsert_device(self, body: dict[str, Any]) -> None:
        device = GPUDevice.from_wire(body).kept()
        key = device.key
        if key not in self._assumed and (left := self._capacity.release_origin(key)):
            self._nodes_touched.add(left)  # what the API says now counts: a settled move's old node frees
        if not self._devices.store.news(key, device.metadata.resource_version):
            return
        assumed = self._assumed.get(key)
        if assumed is not None and version(device.metadata.resource_version) <= assumed[0]:
            return  # the version a decision in flight was made on: the decision stands
        self._store_device(key, device)

    def _store_device(self, key: DeviceKey, device: GPUDevice) -> None:
        old = self._devices.put(key, device)
        if old is not None:
            self._uncount(key, old)
        self._count(key, device)
        self._touch(old, device)

    def _remove_device(self, key: DeviceKey, removal: str | None) -> None:
        old = self._devices.pop(key, removal)
        self._assumed.pop(key, None)
        self._capacity.forget(key)
        if old is not None:
            self._uncount(key, old)
            self._touch(old, None)

    def _count(self, key: DeviceKey, device: GPUDevice) -> None:
        """A device's units where they count: its node (Bound), its namespace's use (§7.2)."""
        node = device.status.node_name
        if node:
            if node not in self.nodes:
                self._gone_nodes.add(node)
            if device.holds_gpus:
                self._capacity.count(key, node, device.spec.class_name, device.spec.count, device.idle)
        if device.in_use:
            self._budgets.add_use(key[0], device.spec.class_name, device.spec.count)

    def _uncount(self, key: DeviceKey, device: GPUDevice) -> None:
        if device.in_use:
            self._budgets.add_use(key[0], device.spec.class_name, -device.spec.count)
        self._capacity.uncount(key)
        if device.status.node_name and not self._devices.names_node(device.status.node_name):
            self._gone_nodes.discard(device.status.node_name)

    def _touch(self, old: GPUDevice | None, new: GPUDevice | None) -> None:
        self._changed = True
        for d in (old, new):
            if d is not None:
                self._namespaces_touched.add(d.namespace or "")
                if d.status.node_name:
                    self._nodes_touched.add(d.status.node_name)
                    # A set Bound or gone on a node changes which of its pods are the operator's.
                    self._unmanaged.recount(d.status.node_name)

    def _recount_class(self, class_name: str) -> None:
        """A class appeared, went or changed its resource or idle moves: its Bound devices are counted anew."""
        for key in self._devices.keys_of_class(class_name):
            device = self.devices[key]
            self._capacity.uncount(key)
            if device.holds_gpus and device.status.node_name:
                self._capacity.count(key, device.status.node_name, class_name, device.spec.count, device.idle)

    # -- pods holding units (§1.3, §12) and VMIs (§6) ----------------------------------------

    def _upsert_pod(self, body: dict[str, Any]) -> None:
        self._pods_touched(self._pods.upsert(body))

    def _remove_pod(self, key: DeviceKey, removal: str | None) -> None:
        self._pods_touched(self._pods.remove(*key, removal))

    def _pods_touched(self, nodes: set[str]) -> None:
        self._nodes_touched |= nodes
        self._changed = bool(nodes)
        for node in nodes:
            self._unmanaged.recount(node)

    def _upsert_vmi(self, body: dict[str, Any]) -> None:
        key = self._vmis.put(body)
        if key is not None:
            self._changed = True
            self._launchers_moved(key)

    def _remove_vmi(self, key: DeviceKey, removal: str | None) -> None:
        self._changed = self._vmis.pop(key, removal)
        self._launchers_moved(key)

    def _launchers_moved(self, key: DeviceKey) -> None:
        """Which set a launcher of the name is measured against follows the VMI of the name (`set_of`)."""
        for pod in self._pods.launchers_of(*key):
            self._nodes_touched.add(pod.node)
            self._unmanaged.recount(pod.node)

    # -- classes, nodes, budgets, namespaces, the rest -----------------------------------------

    def _upsert_class(self, body: dict[str, Any]) -> None:
        cls = GPUClass.from_wire(body)
        if not self._classes.news(cls.name, cls.metadata.resource_version):
            return
        old = self._classes.put(cls.name, cls, cls.metadata.resource_version)
        self._changed = True
        if old is not None and old.spec == cls.spec:
            if old.ready() != cls.ready():
                self._capacity.readied(cls.name)
            return  # a re-delivered event, a metadata or status edit: nothing else a decision reads
        counted = ("resource_name", "idle_moves")  # what a Bound device of the class is counted by
        if old is None or any(getattr(old.spec, f) != getattr(cls.spec, f) for f in counted):
            self._recount_class(cls.name)
        self._class_changed()

    def _remove_class(self, name: str, removal: str | None) -> None:
        old = self._classes.pop(name, removal)
        self._recount_class(name)
        self._changed = old is not None
        self._class_changed(reserve=old is not None)

    def _class_changed(self, reserve: bool = True) -> None:
        """Which node serves what, and which resource a set holds, may differ anywhere now."""
        self._all_nodes = True
        self._unmanaged.recount_everywhere()
        if reserve:
            self._capacity.reserve()

    def _upsert_node(self, body: dict[str, Any]) -> None:
        node = node_info(body)
        if not self._capacity.nodes.news(node.name, node.resource_version):
            return
        self._changed = True
        self._gone_nodes.discard(node.name)
        # A status heartbeat or a resync's list changes nothing a decision reads: no retry for it.
        if self._capacity.put_node(node):
            self._nodes_touched.add(node.name)

    def _remove_node(self, name: str, removal: str | None) -> None:
        old = self._capacity.pop_node(name, removal)
        if self._devices.names_node(name):
            self._gone_nodes.add(name)
        self._nodes_touched.add(name)
        self._changed = old is not None

    def _upsert_gpunode(self, body: dict[str, Any]) -> None:
        node = GPUNode.from_wire(body)
        if self._gpunodes.news(node.name, node.metadata.resource_version):
            self._gpunodes.put(node.name, node, node.metadata.resource_version)
            self._changed = True

    def _remove_gpunode(self, name: str, removal: str | None) -> None:
        self._changed = self._gpunodes.pop(name, removal) is not None

    def _upsert_budget(self, body: dict[str, Any]) -> None:
        budget = GPUBudget.from_wire(body)
        key = budget.key
        if self._budgets.store.news(key, budget.metadata.resource_version):
            self._budgets.put(budget, self.namespaces, self.namespace_labels)
            self._namespaces_touched.add(key[0])
            self._changed = True

    def _remove_budget(self, key: DeviceKey, removal: str | None) -> None:
        self._changed = self._budgets.drop(key, removal) is not None

    def _upsert_namespace(self, body: dict[str, Any]) -> None:
        meta = body.get("metadata", {})
        name = meta.get("name", "")
        if not self._namespaces.news(name, meta.get("resourceVersion")):
            return
        self._namespaces.put(name, dict(meta.get("labels") or {}), meta.get("resourceVersion"))
        self._namespaces_touched.add(name)
        # A budget that took the namespace up or let it go has a new use to report (§9).
        self._namespaces_touched |= {key[0] for key in self._budgets.relabel(name, self.namespace_labels(name))}
        self._changed = True

    def _remove_namespace(self, name: str, removal: str | None) -> None:
        self._changed = self._namespaces.pop(name, removal) is not None
        if self._changed:
            self._namespaces_touched |= {key[0] for key in self._budgets.namespace_gone(name)}

    def _upsert_kubevirt(self, body: dict[str, Any]) -> None:
        meta = body.get("metadata", {})
        key = kinds.KUBEVIRT.key_of(body)
        if not self._kubevirts.news(key, meta.get("resourceVersion")):
            return
        self._kubevirts.put(key, permitted_resources(body), meta.get("resourceVersion"))
        self._changed = True

    def _remove_kubevirt(self, key: DeviceKey, removal: str | None) -> None:
        self._changed = key in self._kubevirts
        self._kubevirts.pop(key, removal)

    # -- reads that join the parts ---------------------------------------------------------

    def cordoned(self) -> frozenset[str]:
        """Nodes taken out of service (spec.unschedulable), kept per node event: what is idle there leaves (§6.8)."""
        return frozenset(self._capacity.cordoned)

    def progress(self, kind: Kind) -> int:
        """The version through which the view has every watch event of `kind` (0 before its first list). What the
        writer put in from our own writes may be newer; what other writers did after it may be missing."""
        return self._progress.get(kind, 0)

    def assumed(self, namespace: str, name: str) -> bool:
        return (namespace, name) in self._assumed

    def gone_nodes(self) -> list[str]:
        """Nodes that some device names but the view does not have, sorted."""
        return sorted(self._gone_nodes)

    def budgets_covering(self, namespace: str) -> list[GPUBudget]:
        """Budgets whose limits apply to orders in the namespace (§1.4), by (namespace, name)."""
        return self._budgets.covering(namespace, namespace in self.namespaces, self.namespace_labels(namespace))

    def budget_use(self, namespace: str, name: str) -> dict[str, int]:
        """Units in use per class in the namespaces the stored budget of that key covers (§7.2)."""
        return self._budgets.used((namespace, name))

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
