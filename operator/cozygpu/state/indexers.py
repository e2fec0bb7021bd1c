"""The cluster view's write side: each kind's handler applies an object to the parts and says what it touched.

Callers: runtime.view (the door) alone holds an `Indexers` (tests/unit/test_layout.py checks that no other
module imports this one). It changes the parts a `state.cluster.Cluster` reads, the way kopf's
`OperatorIndexers` fill the `OperatorIndices` that handlers get: watch events, list items, the responses of
our own writes and fresh reads (`apply`), the watch's progress (`progressed`), and the binder's decisions in
flight (`assume`: counted before their write returns, so no unit is spent twice, §13.1; `settle`). An event
older than what is stored is ignored, and so is the late echo of a removal (`state.store`).

Each handler notes what it touched on a `Touched`, which becomes the `Change` the door hands to the workers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from cozygpu.api import GPUBudget, GPUClass, GPUDevice, GPUNode, kinds
from cozygpu.api.kinds import Kind
from cozygpu.api.kubevirt import kubevirt_config
from cozygpu.state.change import Assumption, Change, DeviceKey
from cozygpu.state.cluster import KINDS, Cluster
from cozygpu.state.nodes import node_info
from cozygpu.state.tombstones import version
from cozygpu.state.vmis import Mark


@dataclasses.dataclass
class Touched:
    """What the object being applied touched, gathered by its kind's handler (see `Change`)."""

    stored: bool = False
    nodes: set[str] = dataclasses.field(default_factory=set)
    namespaces: set[str] = dataclasses.field(default_factory=set)
    all_nodes: bool = False


Handler = Callable[[Touched, Any], None]


class Indexers:
    """The write side of one `Cluster`: the only code that changes its parts."""

    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster
        # The parts it changes: the cluster's own, as kopf's indexers change the indices they fill.
        self._devices = cluster._devices
        self._capacity = cluster._capacity
        self._budgets = cluster._budgets
        self._pods = cluster._pods
        self._unmanaged = cluster._unmanaged
        self._vmis = cluster._vmis
        # Per kind, how an event stores an object or forgets it.
        self._handlers: dict[Kind, tuple[Handler, Handler]] = {
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
        assert set(self._handlers) == set(KINDS)

    def apply(self, kind: Kind, body: dict[str, Any], *, deleted: bool = False) -> Change:
        """Store `body` (a watch event's object, a list item, a write's response), or forget it when
        `deleted` (its resourceVersion, if any, is the removal's); says what changed."""
        meta = body.get("metadata") or {}
        touched = Touched()
        self._capacity.take_room()  # what an earlier change left untaken is not this one's
        upsert, remove = self._handlers[kind]
        if deleted:
            remove(touched, (kind.key_of(body), meta.get("resourceVersion")))
        else:
            upsert(touched, body)
        room, served, reach = self._capacity.take_room()
        return Change(
            kind=kind,
            namespace=meta.get("namespace") or "",
            name=meta.get("name") or "",
            deleted=deleted,
            stored=touched.stored,
            nodes=frozenset(touched.nodes),
            namespaces=frozenset(touched.namespaces),
            all_nodes=touched.all_nodes,
            room=frozenset(room),
            served=frozenset(served),
            guests_gone=frozenset(self._pods.take_ended()),
            reach=frozenset(reach),
        )

    def progressed(self, kind: Kind, resource_version: str) -> None:
        """The watch of `kind` delivered every event through this version (versions only rise)."""
        progress = self._cluster._progress
        progress[kind] = max(progress.get(kind, 0), version(resource_version))

    def assume(self, device: GPUDevice) -> Assumption:
        """Count a decision whose write is in flight (§13.1): stored now, and no event of the version it
        was decided on (a resync's list, a late echo) can undo it until `settle` with the token returned."""
        key = device.key
        self._capacity.take_room()
        token = self._devices.assume(key, device.metadata.resource_version)
        old = self._devices.store.get(key)
        if old is not None and old.holds_gpus and old.status.node_name != device.status.node_name:
            self._capacity.keep_origin(key)  # a move frees nothing until its write is settled (§13.1)
        self._store_device(Touched(), key, device)
        return Assumption(token, frozenset(self._capacity.take_room()[0]))

    def settle(self, namespace: str, name: str, token: int) -> bool:
        """The write of assumption `token` is done (or failed): the API's answer, or a fresh read, counts from
        now on. False, and nothing changed, when the device carries another assumption than this one."""
        return self._devices.settle((namespace, name), token)

    # -- devices -----------------------------------------------------------------------

    def _upsert_device(self, touched: Touched, body: dict[str, Any]) -> None:
        device = GPUDevice.from_wire(body).kept()
        key = device.key
        decided_on = self._devices.decided_on(key)
        if decided_on is None and (left := self._capacity.release_origin(key)):
            touched.nodes.add(left)  # what the API says now counts: a settled move's old node frees
        if not self._devices.store.news(key, device.metadata.resource_version):
            return
        if decided_on is not None and version(device.metadata.resource_version) <= decided_on:
            return  # the version a decision in flight was made on: the decision stands
        self._store_device(touched, key, device)

    def _store_device(self, touched: Touched, key: DeviceKey, device: GPUDevice) -> None:
        old = self._devices.put(key, device)
        if old is not None:
            self._uncount(key, old)
        self._count(key, device)
        self._touch(touched, old, device)

    def _remove_device(self, touched: Touched, gone: tuple[DeviceKey, str | None]) -> None:
        key, removal = gone
        old = self._devices.pop(key, removal)
        self._capacity.forget(key)
        if old is not None:
            self._uncount(key, old)
            self._touch(touched, old, None)

    def _count(self, key: DeviceKey, device: GPUDevice) -> None:
        """A device's units where they count: its node (Bound), its namespace's use (§7.2)."""
        node = device.status.node_name
        if node:
            if node not in self._capacity.nodes.items:
                self._cluster._gone_nodes.add(node)
            if device.holds_gpus:
                self._capacity.count(key, node, device.spec.class_name, device.spec.count, device.idle)
        if device.in_use:
            self._budgets.add_use(key[0], device.spec.class_name, device.spec.count)

    def _uncount(self, key: DeviceKey, device: GPUDevice) -> None:
        if device.in_use:
            self._budgets.add_use(key[0], device.spec.class_name, -device.spec.count)
        self._capacity.uncount(key)
        if device.status.node_name and not self._devices.names_node(device.status.node_name):
            self._cluster._gone_nodes.discard(device.status.node_name)

    def _touch(self, touched: Touched, old: GPUDevice | None, new: GPUDevice | None) -> None:
        touched.stored = True
        for d in (old, new):
            if d is not None:
                touched.namespaces.add(d.namespace or "")
                if d.status.node_name:
                    touched.nodes.add(d.status.node_name)
                    # A set Bound or gone on a node changes which of its pods are the operator's.
                    self._unmanaged.recount(d.status.node_name)

    def _recount_class(self, class_name: str) -> None:
        """A class appeared, went or changed its resource or idle moves: its Bound devices are counted anew."""
        for key in self._devices.keys_of_class(class_name):
            device = self._devices.store.items[key]
            self._capacity.uncount(key)
            if device.holds_gpus and device.status.node_name:
                self._capacity.count(key, device.status.node_name, class_name, device.spec.count, device.idle)

    # -- pods holding units (§1.3, §12) and VMIs (§6) ----------------------------------------

    def _upsert_pod(self, touched: Touched, body: dict[str, Any]) -> None:
        self._pods_touched(touched, self._pods.upsert(body))

    def _remove_pod(self, touched: Touched, gone: tuple[DeviceKey, str | None]) -> None:
        key, removal = gone
        self._pods_touched(touched, self._pods.remove(*key, removal))

    def _pods_touched(self, touched: Touched, nodes: set[str]) -> None:
        touched.nodes |= nodes
        touched.stored = bool(nodes)
        for node in nodes:
            self._unmanaged.recount(node)

    def _upsert_vmi(self, touched: Touched, body: dict[str, Any]) -> None:
        key = kinds.VMI.key_of(body)
        before = self._vmis.mark_of(key)
        if self._vmis.put(body) is not None:
            touched.stored = True
            self._launchers_moved(touched, key)
            self._marks_moved(touched, before, self._vmis.mark_of(key))

    def _remove_vmi(self, touched: Touched, gone: tuple[DeviceKey, str | None]) -> None:
        key, removal = gone
        before = self._vmis.mark_of(key)
        touched.stored = self._vmis.pop(key, removal)
        self._launchers_moved(touched, key)
        self._marks_moved(touched, before, None)

    def _marks_moved(self, touched: Touched, before: Mark | None, after: Mark | None) -> None:
        """A VMI marked for evacuation off a node, or no longer: that node's GPUNode says so (§6.8)."""
        if before != after:
            touched.nodes |= {m.node for m in (before, after) if m is not None}

    def _launchers_moved(self, touched: Touched, key: DeviceKey) -> None:
        """Which set a launcher of the name is measured against follows the VMI of the name (`set_of`)."""
        for pod in self._pods.launchers_of(*key):
            touched.nodes.add(pod.node)
            self._unmanaged.recount(pod.node)

    # -- classes, nodes, budgets, namespaces, the rest -----------------------------------------

    def _upsert_class(self, touched: Touched, body: dict[str, Any]) -> None:
        cls = GPUClass.from_wire(body)
        classes = self._cluster._classes
        if not classes.news(cls.name, cls.metadata.resource_version):
            return
        old = classes.put(cls.name, cls, cls.metadata.resource_version)
        touched.stored = True
        if old is not None and old.spec == cls.spec:
            if old.ready() != cls.ready():
                self._capacity.readied(cls.name)
            return  # a re-delivered event, a metadata or status edit: nothing else a decision reads
        counted = ("resource_name", "idle_moves")  # what a Bound device of the class is counted by
        if old is None or any(getattr(old.spec, f) != getattr(cls.spec, f) for f in counted):
            self._recount_class(cls.name)
        self._class_changed(touched)

    def _remove_class(self, touched: Touched, gone: tuple[str, str | None]) -> None:
        name, removal = gone
        old = self._cluster._classes.pop(name, removal)
        self._recount_class(name)
        touched.stored = old is not None
        self._class_changed(touched, reserve=old is not None)

    def _class_changed(self, touched: Touched, reserve: bool = True) -> None:
        """Which node serves what, and which resource a set holds, may differ anywhere now."""
        touched.all_nodes = True
        self._unmanaged.recount_everywhere()
        if reserve:
            self._capacity.reserve()

    def _upsert_node(self, touched: Touched, body: dict[str, Any]) -> None:
        node = node_info(body)
        if not self._capacity.nodes.news(node.name, node.resource_version):
            return
        touched.stored = True
        self._cluster._gone_nodes.discard(node.name)
        # A status heartbeat or a resync's list changes nothing a decision reads: no retry for it.
        if self._capacity.put_node(node):
            touched.nodes.add(node.name)

    def _remove_node(self, touched: Touched, gone: tuple[str, str | None]) -> None:
        name, removal = gone
        old = self._capacity.pop_node(name, removal)
        if self._devices.names_node(name):
            self._cluster._gone_nodes.add(name)
        touched.nodes.add(name)
        touched.stored = old is not None

    def _upsert_gpunode(self, touched: Touched, body: dict[str, Any]) -> None:
        node = GPUNode.from_wire(body)
        gpunodes = self._cluster._gpunodes
        if gpunodes.news(node.name, node.metadata.resource_version):
            gpunodes.put(node.name, node, node.metadata.resource_version)
            touched.stored = True

    def _remove_gpunode(self, touched: Touched, gone: tuple[str, str | None]) -> None:
        touched.stored = self._cluster._gpunodes.pop(*gone) is not None

    def _upsert_budget(self, touched: Touched, body: dict[str, Any]) -> None:
        budget = GPUBudget.from_wire(body)
        key = budget.key
        if self._budgets.store.news(key, budget.metadata.resource_version):
            self._budgets.put(budget, self._cluster.namespaces, self._cluster.namespace_labels)
            touched.namespaces.add(key[0])
            touched.stored = True

    def _remove_budget(self, touched: Touched, gone: tuple[DeviceKey, str | None]) -> None:
        touched.stored = self._budgets.drop(*gone) is not None

    def _upsert_namespace(self, touched: Touched, body: dict[str, Any]) -> None:
        meta = body.get("metadata", {})
        name = meta.get("name", "")
        namespaces = self._cluster._namespaces
        if not namespaces.news(name, meta.get("resourceVersion")):
            return
        namespaces.put(name, dict(meta.get("labels") or {}), meta.get("resourceVersion"))
        touched.namespaces.add(name)
        # A budget that took the namespace up or let it go has a new use to report (§9).
        labels = self._cluster.namespace_labels(name)
        touched.namespaces |= {key[0] for key in self._budgets.relabel(name, labels)}
        touched.stored = True

    def _remove_namespace(self, touched: Touched, gone: tuple[str, str | None]) -> None:
        name, removal = gone
        touched.stored = self._cluster._namespaces.pop(name, removal) is not None
        if touched.stored:
            touched.namespaces |= {key[0] for key in self._budgets.namespace_gone(name)}

    def _upsert_kubevirt(self, touched: Touched, body: dict[str, Any]) -> None:
        meta = body.get("metadata", {})
        key = kinds.KUBEVIRT.key_of(body)
        kubevirts = self._cluster._kubevirts
        if not kubevirts.news(key, meta.get("resourceVersion")):
            return
        kubevirts.put(key, kubevirt_config(body), meta.get("resourceVersion"))
        touched.stored = True

    def _remove_kubevirt(self, touched: Touched, gone: tuple[DeviceKey, str | None]) -> None:
        key, removal = gone
        kubevirts = self._cluster._kubevirts
        touched.stored = key in kubevirts.items
        kubevirts.pop(key, removal)
