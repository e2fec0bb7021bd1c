"""The in-memory cluster view: objects by key plus the indexes decisions read.

Callers: everything goes in through `apply` (runtime.view, the one door: watch
events, resync lists, the responses of our own writes, fresh reads), which says what
changed as a `Change`; the binder also counts its decisions in flight
(`assume_device`), so a decision is counted before its write returns and no unit is
spent twice. An event older than what is stored (lower resourceVersion) is ignored
for the same reason, and so is a write's response that lands after the object's
removal (`tombstones`).
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime as dt
import heapq
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from cozygpu.api import GPUBudget, GPUClass, GPUDevice, GPUNode, references
from cozygpu.api.kinds import VIEWED
from cozygpu.state.budgets import BudgetIndex
from cozygpu.state.counts import add as _add
from cozygpu.state.nodes import NodeInfo, node_info
from cozygpu.state.pods import PodUsage, PodUse
from cozygpu.state.serving import ServingIndex
from cozygpu.state.tombstones import DEFAULT_LIMIT, Tombstones, version

DeviceKey = tuple[str, str]  # (namespace, name)

# Every kind the view holds, by name.
KINDS = tuple(k.kind for k in VIEWED)


@dataclasses.dataclass(frozen=True)
class Change:
    """What one event, list item or write's response did to the view; the workers that care subscribe.

    `stored` is False when the view ignored it (older than what it holds, a removed object's echo).
    `nodes` and `namespaces` name where derived status may differ now (GPUNode §8, budget use §9);
    `all_nodes` when a class changed, since any node may serve it or stop serving it. `room` names the
    classes where a waiting device may fit now (units freed, a node started serving, §5.5); `served` the
    classes whose serving nodes changed, so a waiting device's reason may read differently; `guests_gone` the
    VMIs whose last launcher pod stopped holding units, so their sets may be released now (§6.7)."""

    kind: str
    namespace: str
    name: str
    deleted: bool
    stored: bool
    nodes: frozenset[str] = frozenset()
    namespaces: frozenset[str] = frozenset()
    all_nodes: bool = False
    room: frozenset[str] = frozenset()
    served: frozenset[str] = frozenset()
    guests_gone: frozenset[DeviceKey] = frozenset()  # VMIs (namespace, name) whose last launcher pod ended (§6.7)


@dataclasses.dataclass(frozen=True)
class Assumption:
    """A decision counted in the view before its write returns (`Cluster.assume_device`): its token for
    `settle_device`, and the classes where it freed room (a gather moving a device off a node)."""

    token: int
    room: frozenset[str]


def _drop(index: dict[Any, set[DeviceKey]], value: Any, key: DeviceKey) -> None:
    if value in index:
        index[value].discard(key)
        if not index[value]:
            del index[value]


_LAST = dt.datetime.max.replace(tzinfo=dt.UTC)
Turn = tuple[dt.datetime, int, str, str]  # §5.5: creation, first sight, namespace, name


def _newer(stored: str | None, incoming: str | None) -> bool:
    return stored is None or version(incoming) >= version(stored)


class Cluster:
    """Every object the decisions need, kept current from events."""

    def __init__(self, tombstones: int = DEFAULT_LIMIT) -> None:
        # Per kind: our own writes' responses and resync lists can arrive after a removal.
        self._gone = {kind: Tombstones(tombstones) for kind in KINDS}
        self.classes: dict[str, GPUClass] = {}
        self.devices: dict[DeviceKey, GPUDevice] = {}
        # Budgets with what each covers and the units in use under each (§7): checks without a walk.
        self._budgets = BudgetIndex()
        self.budgets: Mapping[DeviceKey, GPUBudget] = MappingProxyType(self._budgets.budgets)  # read-only: one door
        self.nodes: dict[str, NodeInfo] = {}
        self.namespaces: dict[str, dict[str, str]] = {}
        self._by_node: dict[str, set[DeviceKey]] = defaultdict(set)
        self._by_namespace: dict[str, set[DeviceKey]] = defaultdict(set)
        self._by_request: dict[str, set[DeviceKey]] = defaultdict(set)
        self._open_requests: dict[str, set[DeviceKey]] = defaultdict(set)
        self._by_attachment: dict[DeviceKey, set[DeviceKey]] = defaultdict(set)  # (namespace, vmi) -> devices
        self._by_class: dict[str, set[DeviceKey]] = defaultdict(set)
        # Nodes that devices name but the view does not have (§5.6), kept as both change.
        self._gone_nodes: set[str] = set()
        # Nodes by the resources in their allocatable: placement looks only at nodes that have them.
        self._nodes_by_resource: dict[str, set[str]] = defaultdict(set)
        # Per resource, how many nodes serve each count of units: the largest a node has, without a scan (§3.7).
        self._unit_sizes: dict[str, dict[int, int]] = defaultdict(dict)
        # VMIs with device references, by (namespace, name): their uid (§6).
        self.vmis: dict[DeviceKey, str] = {}
        # And the devices each names (§14.2): a device a losing create of the name attached is not the VMI's.
        self._vmi_names: dict[DeviceKey, frozenset[str]] = {}
        # Versions of what is stored as plain data (VMIs, namespaces, KubeVirt CRs), for resyncs.
        self._raw_versions: dict[str, dict[Any, int]] = {"VirtualMachineInstance": {}, "Namespace": {}, "KubeVirt": {}}
        self._vmi_uids: set[str] = set()
        self.pods = PodUsage(tombstones)  # units pods hold per node: those the operator did not place (§1.3)
        # Devices not Bound, first come first served (§5.5), kept in order rather than sorted per pass.
        self._turns: list[Turn] = []
        self._turn_of: dict[DeviceKey, Turn] = {}
        # Devices the binder places on its own (`GPUDevice.awaits_node`) by class and count, each in turn:
        # room for a class wakes only those of its devices that fit in it (§14.3).
        self._waiting: dict[str, dict[int, list[Turn]]] = {}
        self._waiting_at: dict[DeviceKey, tuple[str, int, Turn]] = {}
        # Per class, the nodes serving it by free units, and the others with its resource (§5.1, §5.3).
        self._serving = ServingIndex()
        # Units of Bound devices per node and resource, each device as it was counted, and every
        # resource's nodes ordered by free units: best fit without scanning the nodes.
        self._held_res: dict[str, dict[str, int]] = {}
        self._counted: dict[DeviceKey, tuple[str, str, int, str]] = {}
        # Units of Bound devices per class, and units in use per namespace and class (§7.2): status and
        # budget checks read these instead of walking devices.
        self._held_class: dict[str, int] = {}
        self._use: dict[str, dict[str, int]] = {}
        self._by_free: dict[str, list[tuple[int, str]]] = defaultdict(list)
        # Units pods the operator did not place hold per node and resource (§12): not free either.
        self._unmanaged_res: dict[str, dict[str, int]] = {}
        self._free_at: dict[tuple[str, str], int] = {}
        # Decisions whose writes are in flight, with the resourceVersion each was decided on.
        self._assumed: dict[DeviceKey, tuple[int, int]] = {}  # the version decided on, the assumption's token
        self._assumptions = 0
        # Order of first sight: creation timestamps have one-second precision, so devices
        # created within a second are told apart by when the watch delivered them.
        self._arrival: dict[DeviceKey, int] = {}
        self._arrivals = 0
        self.gpunodes: dict[str, GPUNode] = {}
        # KubeVirt CRs by (namespace, name): the resource names each permits (§1.5); None: no table set.
        self.kubevirts: dict[DeviceKey, set[str] | None] = {}
        # What the change being applied touched; `apply` hands it out as a `Change`.
        self._nodes_touched: set[str] = set()
        self._namespaces_touched: set[str] = set()
        self._all_nodes = False
        self._changed = False
        self._room: set[str] = set()
        self._served: set[str] = set()
        # kind -> (store a body, forget by (namespace, name) and the removal's version)
        self._apply: dict[str, tuple[Callable[[dict[str, Any]], object], Callable[[str, str, str | None], None]]] = {
            "GPUDevice": (self.upsert_device, self.remove_device),
            "GPUClass": (self.upsert_class, lambda _ns, n, rv: self.remove_class(n, rv)),
            "GPUBudget": (self.upsert_budget, self.remove_budget),
            "GPUNode": (self.upsert_gpunode, lambda _ns, n, rv: self.remove_gpunode(n, rv)),
            "Node": (self.upsert_node, lambda _ns, n, rv: self.remove_node(n, rv)),
            "Namespace": (self.upsert_namespace, lambda _ns, n, rv: self.remove_namespace(n, rv)),
            "KubeVirt": (self.upsert_kubevirt, self.remove_kubevirt),
            "VirtualMachineInstance": (self.upsert_vmi, self.remove_vmi),
            "Pod": (self._upsert_pod, self._remove_pod),
        }

    # -- the door ----------------------------------------------------------

    def apply(self, kind: str, body: dict[str, Any], *, deleted: bool = False) -> Change:
        """Store `body` (a watch event's object, a list item, a write's response), or forget it when
        `deleted` (its resourceVersion, if any, is the removal's); says what changed."""
        meta = body.get("metadata") or {}
        namespace, name = meta.get("namespace") or "", meta.get("name") or ""
        self._begin()
        upsert, remove = self._apply[kind]
        if deleted:
            remove(namespace, name, meta.get("resourceVersion"))
        else:
            upsert(body)
        return Change(
            kind, namespace, name, deleted, self._changed,
            frozenset(self._nodes_touched), frozenset(self._namespaces_touched), self._all_nodes,
            frozenset(self._room), frozenset(self._served), frozenset(self.pods.take_ended()),
        )  # fmt: skip

    def _begin(self) -> None:
        self._nodes_touched, self._namespaces_touched, self._all_nodes = set(), set(), False
        self._changed = False
        self._room, self._served = set(), set()

    # -- devices -----------------------------------------------------------

    def upsert_device(self, body: dict[str, Any] | GPUDevice) -> GPUDevice | None:
        """Store a device unless what is stored is newer; returns the stored one."""
        device = body if isinstance(body, GPUDevice) else GPUDevice.from_wire(body)
        key = (device.namespace or "", device.name)
        if self._gone["GPUDevice"].stale(key, device.metadata.resource_version):
            return None
        old = self.devices.get(key)
        if old is not None and not _newer(old.metadata.resource_version, device.metadata.resource_version):
            return old
        assumed = self._assumed.get(key)
        if assumed is not None and version(device.metadata.resource_version) <= assumed[0]:
            return old  # the version a decision in flight was made on: the decision stands
        return self._store(key, old, device)

    def assume_device(self, device: GPUDevice) -> Assumption:
        """Count a decision whose write is in flight (§13.1): stored now, and no event of the version it
        was decided on (a resync's list, a late echo) can undo it until `settle_device` with the token
        returned here."""
        key = (device.namespace or "", device.name)
        self._begin()
        self._assumptions += 1
        self._assumed[key] = (version(device.metadata.resource_version), self._assumptions)
        self._store(key, self.devices.get(key), device)
        return Assumption(self._assumptions, frozenset(self._room))

    def settle_device(self, namespace: str, name: str, token: int) -> bool:
        """The write of assumption `token` is done (or failed): the API's answer, or a fresh read, counts from
        now on. False, and nothing changed, when the device carries another assumption than this one."""
        key = (namespace, name)
        if key not in self._assumed or self._assumed[key][1] != token:
            return False
        del self._assumed[key]
        return True

    def assumed(self, namespace: str, name: str) -> bool:
        return (namespace, name) in self._assumed

    def _store(self, key: DeviceKey, old: GPUDevice | None, device: GPUDevice) -> GPUDevice:
        if old is not None:
            self._unindex(key, old)
        if key not in self._arrival:
            self._arrivals += 1
            self._arrival[key] = self._arrivals
        self.devices[key] = device
        self._index(key, device)
        self._touch(old, device)
        return device

    def remove_device(self, namespace: str, name: str, resource_version: str | None = None) -> None:
        """Forget the device; `resource_version` is the removal's (a DELETED event's), if known."""
        key = (namespace, name)
        old = self.devices.pop(key, None)
        self._bury("GPUDevice", key, resource_version, old.metadata.resource_version if old else None)
        self._arrival.pop(key, None)
        self._assumed.pop(key, None)
        if old is not None:
            self._unindex(key, old)
            self._touch(old, None)

    def _touch(self, old: GPUDevice | None, new: GPUDevice | None) -> None:
        self._changed = True
        for d in (old, new):
            if d is not None:
                self._namespaces_touched.add(d.namespace or "")
                if d.status.node_name:
                    self._nodes_touched.add(d.status.node_name)
                    # A set Bound or gone on a node changes which of its pods are the operator's.
                    self._recount_unmanaged(d.status.node_name)

    def _index(self, key: DeviceKey, device: GPUDevice) -> None:
        if device.status.node_name:
            self._by_node[device.status.node_name].add(key)
            if device.status.node_name not in self.nodes:
                self._gone_nodes.add(device.status.node_name)
        if device.holds_gpus and device.status.node_name:
            self._count(key, device)
        self._by_namespace[key[0]].add(key)
        self._by_class[device.spec.class_name].add(key)
        if device.status.attached_to is not None:
            self._by_attachment[(key[0], device.status.attached_to.vmi)].add(key)
        request = device.status.bind_request
        if request is not None:
            self._by_request[request.id].add(key)
            if request.open:
                self._open_requests[request.id].add(key)
        if not device.holds_gpus:
            turn = self.turn(device)
            bisect.insort(self._turns, turn)
            self._turn_of[key] = turn
            if device.awaits_node:
                class_name, count = device.spec.class_name, device.spec.count
                bisect.insort(self._waiting.setdefault(class_name, {}).setdefault(count, []), turn)
                self._waiting_at[key] = (class_name, count, turn)
        if device.in_use:
            _add(self._use.setdefault(key[0], {}), device.spec.class_name, device.spec.count)
            self._budgets.add_use(key[0], device.spec.class_name, device.spec.count)

    def _unindex(self, key: DeviceKey, device: GPUDevice) -> None:
        turn = self._turn_of.pop(key, None)
        if turn is not None:
            del self._turns[bisect.bisect_left(self._turns, turn)]
        waiting = self._waiting_at.pop(key, None)
        if waiting is not None:
            class_name, count, turn = waiting
            of_class = self._waiting[class_name]
            in_line = of_class[count]
            del in_line[bisect.bisect_left(in_line, turn)]
            if not in_line:
                del of_class[count]
                if not of_class:
                    del self._waiting[class_name]
        if device.in_use:
            use = self._use[key[0]]
            _add(use, device.spec.class_name, -device.spec.count)
            if not use:
                del self._use[key[0]]
            self._budgets.add_use(key[0], device.spec.class_name, -device.spec.count)
        self._uncount(key)
        request, open_request = device.status.bind_request, device.open_request
        attached = device.status.attached_to
        if attached is not None:
            _drop(self._by_attachment, (key[0], attached.vmi), key)
        for index, value in (
            (self._by_class, device.spec.class_name),
            (self._by_node, device.status.node_name),
            (self._by_namespace, key[0]),
            (self._by_request, request.id if request else None),
            (self._open_requests, open_request.id if open_request else None),
        ):
            if value is not None:
                _drop(index, value, key)
        if device.status.node_name not in self._by_node:
            self._gone_nodes.discard(device.status.node_name or "")

    def device(self, namespace: str, name: str) -> GPUDevice | None:
        return self.devices.get((namespace, name))

    def arrival(self, namespace: str, name: str) -> int:
        return self._arrival.get((namespace, name), 0)

    def turn(self, device: GPUDevice) -> Turn:
        """§5.5 first come first served: by creation, then by when the view first saw it (creation times have
        one-second precision), then by name; a device without a creation time (never from the API) last."""
        namespace = device.namespace or ""
        created = device.metadata.creation_timestamp or _LAST
        return created, self._arrival.get((namespace, device.name), 0), namespace, device.name

    # -- free units per node and resource (§5.1), ordered for best fit (§5.3, §13.1) ---------

    def _count(self, key: DeviceKey, device: GPUDevice) -> None:
        """A Bound device's units against its node and its class's resource, as known now."""
        cls = self.classes.get(device.spec.class_name)
        node = device.status.node_name
        if cls is None or node is None:
            return  # counted once its class is known (`_recount_class`)
        resource, class_name = cls.spec.resource_name, device.spec.class_name
        self._counted[key] = (node, resource, device.spec.count, class_name)
        per_node = self._held_res.setdefault(node, {})
        per_node[resource] = per_node.get(resource, 0) + device.spec.count
        self._held_class[class_name] = self._held_class.get(class_name, 0) + device.spec.count
        self._reorder(node, resource)

    def _uncount(self, key: DeviceKey) -> None:
        counted = self._counted.pop(key, None)
        if counted is None:
            return
        node, resource, units, class_name = counted
        self._held_class[class_name] -= units
        if not self._held_class[class_name]:
            del self._held_class[class_name]
        per_node = self._held_res[node]
        per_node[resource] -= units
        if not per_node[resource]:
            del per_node[resource]
            if not per_node:
                del self._held_res[node]
        self._reorder(node, resource)

    def _recount_class(self, class_name: str) -> None:
        """A class appeared, went or changed its resource: its Bound devices are counted anew."""
        for key in self._by_class.get(class_name, ()):
            device = self.devices[key]
            self._uncount(key)
            if device.holds_gpus and device.status.node_name:
                self._count(key, device)

    def _reorder(self, node: str, resource: str) -> None:
        """Put (free, node) where it belongs in the resource's order, or take it out."""
        order = self._by_free[resource]
        old = self._free_at.pop((resource, node), None)
        if old is not None:
            del order[bisect.bisect_left(order, (old, node))]
        info = self.nodes.get(node)
        if info is not None and resource in info.allocatable:
            taken = self._held_res.get(node, {}).get(resource, 0) + self._unmanaged_res.get(node, {}).get(resource, 0)
            now = info.free(resource, taken)
            bisect.insort(order, (now, node))
            self._free_at[(resource, node)] = now
            if now != old:
                self._room |= self._serving.free(node, resource, now)
        if not order:
            del self._by_free[resource]

    def held_of_class(self, class_name: str) -> int:
        """Units of the class's Bound devices, on every node (counted once the class is known)."""
        return self._held_class.get(class_name, 0)

    def use_in(self, namespace: str) -> dict[str, int]:
        """Units in use per class in the namespace, as budgets count them (§7.2, `GPUDevice.in_use`)."""
        return dict(self._use.get(namespace, {}))

    def held_units(self, node: str) -> dict[str, int]:
        """Units held on the node per resource by Bound devices (of every namespace)."""
        return dict(self._held_res.get(node, {}))

    def unmanaged_units(self, node: str) -> dict[str, int]:
        """Units pods the operator did not place hold on the node, per resource (§12; `unmanaged_on`)."""
        return dict(self._unmanaged_res.get(node, {}))

    def taken_units(self, node: str) -> dict[str, int]:
        """Units not free on the node per resource: held by Bound devices or by pods the operator did not place."""
        taken = dict(self._held_res.get(node, {}))
        for resource, units in self._unmanaged_res.get(node, {}).items():
            taken[resource] = taken.get(resource, 0) + units
        return taken

    def best_fit(self, resource: str, units: int) -> Iterator[str]:
        """Nodes with at least `units` free of the resource, fewest free first, then by name: where
        bin-packing puts a new set of that one resource (§5.3), found in O(log n)."""
        order = self._by_free.get(resource, [])
        for index in range(bisect.bisect_left(order, (units, "")), len(order)):
            yield order[index][1]

    def devices_on(self, node: str) -> Iterator[GPUDevice]:
        """Devices whose status names the node (Bound there or Lost from there)."""
        for key in self._by_node.get(node, ()):
            yield self.devices[key]

    def held_by_class(self, node: str) -> dict[str, int]:
        """Units held on the node by Bound devices, per class name (summed from the node's few devices;
        decisions read the counters per resource, `held_units`)."""
        out: dict[str, int] = {}
        for d in self.devices_on(node):
            if d.holds_gpus and d.status.node_name == node:
                out[d.spec.class_name] = out.get(d.spec.class_name, 0) + d.spec.count
        return out

    def most_units(self, resource: str) -> int:
        """The most units of `resource` any one node serves (0 if none): over the distinct sizes, not the nodes."""
        return max(self._unit_sizes.get(resource, {0: 1}))

    def nodes_with(self, resources: Iterable[str]) -> list[str]:
        """Names of the nodes whose allocatable names every one of the resources, sorted."""
        sets = [self._nodes_by_resource.get(r, set()) for r in resources]
        if not sets:
            return []
        return sorted(set.intersection(*sets))

    def devices_in(self, namespace: str) -> Iterator[GPUDevice]:
        for key in self._by_namespace.get(namespace, ()):
            yield self.devices[key]

    def devices_of_request(self, request_id: str) -> list[GPUDevice]:
        return [self.devices[k] for k in self._by_request.get(request_id, ())]

    def attached_to(self, namespace: str, vmi: str) -> list[GPUDevice]:
        """Devices whose attachment names this VMI (any uid)."""
        return [self.devices[k] for k in self._by_attachment.get((namespace, vmi), ())]

    def devices_of_class(self, name: str) -> list[GPUDevice]:
        return [self.devices[k] for k in self._by_class.get(name, ())]

    def _admit_raw(self, kind: str, key: Any, meta: dict[str, Any]) -> bool:
        """Whether a plain-data object's event is news: not older than what is stored, not a removed one's echo."""
        incoming = meta.get("resourceVersion")
        if self._gone[kind].stale(key, incoming):
            return False
        stored = self._raw_versions[kind].get(key)
        return stored is None or version(incoming) >= stored

    def _bury_raw(self, kind: str, key: Any, removal: str | None) -> None:
        self._gone[kind].bury(key, max(version(removal), self._raw_versions[kind].pop(key, 0)))

    def upsert_vmi(self, body: dict[str, Any]) -> None:
        meta = body.get("metadata", {})
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if not self._admit_raw("VirtualMachineInstance", key, meta):
            return
        self._vmi_uids.discard(self.vmis.get(key, ""))  # a new VMI of the name is another VMI (§6.2)
        self.vmis[key] = meta.get("uid", "")
        self._vmi_uids.add(self.vmis[key])
        self._vmi_names[key] = references.device_names(key[1], meta.get("annotations"))
        self._raw_versions["VirtualMachineInstance"][key] = version(meta.get("resourceVersion"))
        self._changed = True
        self._launchers_moved(*key)

    def remove_vmi(self, namespace: str, name: str, resource_version: str | None = None) -> None:
        self._changed = (namespace, name) in self.vmis
        self._vmi_uids.discard(self.vmis.pop((namespace, name), ""))
        self._vmi_names.pop((namespace, name), None)
        self._bury_raw("VirtualMachineInstance", (namespace, name), resource_version)
        self._launchers_moved(namespace, name)

    def _launchers_moved(self, namespace: str, vmi: str) -> None:
        """Which set a launcher of the name is measured against follows the VMI of the name (`set_of`)."""
        for pod in self.pods.launchers_of(namespace, vmi):
            self._nodes_touched.add(pod.node)
            self._recount_unmanaged(pod.node)

    def names_device(self, namespace: str, vmi: str, device: str) -> bool:
        """Whether the VMI of this name that the view has names the device among its references (§14.2)."""
        return device in self._vmi_names.get((namespace, vmi), ())

    def set_of(self, namespace: str, vmi: str, uid: str) -> list[GPUDevice]:
        """The devices attached to the VMI object `uid` of this name: those with its uid recorded, and those not
        recorded yet that it names (§6.1, §14.2). Until the view has that VMI, every unrecorded one counts."""
        live = self.vmis.get((namespace, vmi))
        names: frozenset[str] | None = None  # the view has no VMI of the name yet
        if live is not None:
            names = self._vmi_names.get((namespace, vmi), frozenset()) if live == uid else frozenset()
        out = []
        for d in self.attached_to(namespace, vmi):
            recorded = d.status.attached_to.uid if d.status.attached_to is not None else None
            if recorded == uid or (recorded is None and (names is None or d.name in names)):
                out.append(d)
        return out

    def vmi_exists(self, uid: str) -> bool:
        """Whether a VMI with this uid exists (any namespace, any name)."""
        return bool(uid) and uid in self._vmi_uids

    def open_request_ids(self) -> list[str]:
        """Ids of bind requests that some device carries without a result."""
        return list(self._open_requests)

    def waiting(self, class_name: str, most: int | None = None) -> list[GPUDevice]:
        """The class's devices the binder places on its own (`GPUDevice.awaits_node`) that ask for at most
        `most` units (every one if None), first come first served: the few that room can wake (§14.3)."""
        of_class = self._waiting.get(class_name, {})
        lines = [line for count, line in of_class.items() if most is None or count <= most]
        return [self.devices[(t[2], t[3])] for t in heapq.merge(*lines)]

    def next_waiting(self, class_name: str, most: int, after: Turn | None) -> GPUDevice | None:
        """The class's first device in turn after `after` that awaits a node and asks for at most `most`
        units: a cursor over the waiting room that devices placed or arriving meanwhile do not upset."""
        best: Turn | None = None
        for count, line in self._waiting.get(class_name, {}).items():
            if count > most:
                continue
            at = 0 if after is None else bisect.bisect_right(line, after)
            if at < len(line) and (best is None or line[at] < best):
                best = line[at]
        return None if best is None else self.devices[(best[2], best[3])]

    @property
    def serving(self) -> ServingIndex:
        """Per class, the nodes that serve it by free units (`state.serving`); read-only outside the view."""
        return self._serving

    def unbound_in_turn(self) -> list[GPUDevice]:
        """Devices not Bound, first come first served (`turn`), from the order kept as they change."""
        return [self.devices[(t[2], t[3])] for t in self._turns]

    def gone_nodes(self) -> list[str]:
        """Nodes that some device names but the view does not have, sorted."""
        return sorted(self._gone_nodes)

    # -- pods holding units (§1.3, §12) ---------------------------------------

    def _upsert_pod(self, body: dict[str, Any]) -> None:
        self._pods_touched(self.pods.upsert(body))

    def _remove_pod(self, namespace: str, name: str, resource_version: str | None) -> None:
        self._pods_touched(self.pods.remove(namespace, name, resource_version))

    def _pods_touched(self, nodes: set[str]) -> None:
        self._nodes_touched |= nodes
        self._changed = bool(nodes)
        for node in nodes:
            self._recount_unmanaged(node)

    def _set_on_node(self, pod: PodUse) -> dict[str, int]:
        """Units per resource the devices of the pod's VMI (by its uid, §6.7) hold Bound on the pod's node."""
        out: dict[str, int] = {}
        for d in self.set_of(pod.namespace, pod.vmi, pod.vmi_uid or "") if pod.vmi else ():
            cls = self.classes.get(d.spec.class_name)
            if cls is not None and d.holds_gpus and d.status.node_name == pod.node:
                out[cls.spec.resource_name] = out.get(cls.spec.resource_name, 0) + d.spec.count
        return out

    def unmanaged_on(self, node: str) -> list[tuple[PodUse, dict[str, int]]]:
        """The pods on the node holding units no device the operator Bound there accounts for, each with those
        units. A launcher is the operator's up to what its VMI's set holds on this very node (§12.2 caps it
        there); each launcher is measured on its own, so a restart's old launcher, still terminating beside
        the new one, is not counted twice. Every other pod's units are unmanaged."""
        out = []
        for pod in self.pods.on(node):
            own = self._set_on_node(pod)
            extra = {r: n - own.get(r, 0) for r, n in sorted(pod.units.items()) if n > own.get(r, 0)}
            if extra:
                out.append((pod, extra))
        return out

    def _recount_unmanaged(self, node: str) -> None:
        """Keep the node's unmanaged units current; room that appears is news for waiting devices (§5.5)."""
        if node not in self._unmanaged_res and not self.pods.holds_on(node):
            return
        now: dict[str, int] = {}
        for _, extra in self.unmanaged_on(node):
            for resource, units in extra.items():
                now[resource] = now.get(resource, 0) + units
        before = self._unmanaged_res.pop(node, {})
        if now:
            self._unmanaged_res[node] = now
        if now == before:
            return
        for resource in set(now) | set(before):
            self._reorder(node, resource)

    # -- the rest ----------------------------------------------------------

    def _bury(self, kind: str, key: Any, removal: str | None, stored: str | None) -> None:
        self._gone[kind].bury(key, max(version(removal), version(stored)))

    def upsert_gpunode(self, body: dict[str, Any]) -> None:
        node = GPUNode.from_wire(body)
        if self._gone["GPUNode"].stale(node.name, node.metadata.resource_version):
            return
        old = self.gpunodes.get(node.name)
        if old is None or _newer(old.metadata.resource_version, node.metadata.resource_version):
            self.gpunodes[node.name] = node
            self._changed = True

    def remove_gpunode(self, name: str, resource_version: str | None = None) -> None:
        old = self.gpunodes.pop(name, None)
        self._changed = old is not None
        self._bury("GPUNode", name, resource_version, old.metadata.resource_version if old else None)

    def upsert_class(self, body: dict[str, Any]) -> None:
        cls = GPUClass.from_wire(body)
        if self._gone["GPUClass"].stale(cls.name, cls.metadata.resource_version):
            return
        old = self.classes.get(cls.name)
        if old is None or _newer(old.metadata.resource_version, cls.metadata.resource_version):
            self.classes[cls.name] = cls
            self._changed = True
            if old is not None and old.spec == cls.spec:
                return  # a re-delivered event or a metadata edit: nothing a decision reads
            if old is None or old.spec.resource_name != cls.spec.resource_name:
                self._recount_class(cls.name)
            self._all_nodes = True
            self._recount_unmanaged_everywhere()
            self._reserve()

    def remove_class(self, name: str, resource_version: str | None = None) -> None:
        old = self.classes.pop(name, None)
        self._bury("GPUClass", name, resource_version, old.metadata.resource_version if old else None)
        self._recount_class(name)
        self._all_nodes, self._changed = True, old is not None
        self._recount_unmanaged_everywhere()
        if old is not None:
            self._reserve()

    def _reserve(self) -> None:
        """A class changed: which node serves what is judged anew everywhere; every class may read anew."""
        every = self._serving.rebuild(self.nodes.values(), self.classes, self._free_units)
        self._room |= every
        self._served |= every

    def _free_units(self, node: str, resource: str) -> int:
        return self._free_at.get((resource, node), 0)

    def _recount_unmanaged_everywhere(self) -> None:
        """A class changed: which resource a set holds may have too (few nodes: those with such pods)."""
        for node in set(self.pods.nodes()) | set(self._unmanaged_res):
            self._recount_unmanaged(node)

    def upsert_budget(self, body: dict[str, Any]) -> None:
        budget = GPUBudget.from_wire(body)
        key = (budget.namespace or "", budget.name)
        if self._gone["GPUBudget"].stale(key, budget.metadata.resource_version):
            return
        old = self.budgets.get(key)
        if old is None or _newer(old.metadata.resource_version, budget.metadata.resource_version):
            self._budgets.put(budget, self.namespaces, self.namespace_labels, self.use_in)
            self._namespaces_touched.add(key[0])
            self._changed = True

    def remove_budget(self, namespace: str, name: str, resource_version: str | None = None) -> None:
        old = self._budgets.drop((namespace, name))
        self._changed = old is not None
        self._bury("GPUBudget", (namespace, name), resource_version, old.metadata.resource_version if old else None)

    def upsert_node(self, body: dict[str, Any]) -> NodeInfo | None:
        node = node_info(body)
        if self._gone["Node"].stale(node.name, node.resource_version):
            return None
        old = self.nodes.get(node.name)
        if old is not None and not _newer(old.resource_version, node.resource_version):
            return old
        self._unindex_node(old)
        self._changed = True
        self.nodes[node.name] = node
        self._gone_nodes.discard(node.name)
        for resource, units in node.allocatable.items():
            self._nodes_by_resource[resource].add(node.name)
            _add(self._unit_sizes[resource], units, 1)
        for resource in set(node.allocatable) | set(old.allocatable if old else ()):
            self._reorder(node.name, resource)
        # A status heartbeat or a resync's list changes nothing a decision reads: no retry for it.
        if old is None or dataclasses.replace(old, resource_version=node.resource_version) != node:
            self._served |= self._serving.node(old, node, self.classes, self._free_units)
            self._nodes_touched.add(node.name)
        return node

    def _unindex_node(self, node: NodeInfo | None) -> None:
        if node is None:
            return
        for resource, units in node.allocatable.items():
            names = self._nodes_by_resource[resource]
            names.discard(node.name)
            if not names:
                del self._nodes_by_resource[resource]
            _add(self._unit_sizes[resource], units, -1)
            if not self._unit_sizes[resource]:
                del self._unit_sizes[resource]

    def remove_node(self, name: str, resource_version: str | None = None) -> None:
        old = self.nodes.pop(name, None)
        self._bury("Node", name, resource_version, old.resource_version if old else None)
        self._unindex_node(old)
        if name in self._by_node:
            self._gone_nodes.add(name)
        self._served |= self._serving.node(old, None, self.classes, self._free_units)
        for resource in old.allocatable if old else ():
            self._reorder(name, resource)
        self._nodes_touched.add(name)
        self._changed = old is not None

    def upsert_kubevirt(self, body: dict[str, Any]) -> None:
        meta = body.get("metadata", {})
        if not self._admit_raw("KubeVirt", (meta.get("namespace", ""), meta.get("name", "")), meta):
            return
        permitted = (body.get("spec", {}).get("configuration") or {}).get("permittedHostDevices")
        # KubeVirt's pod renderer restricts host devices only when the table is set at all.
        names = None
        if isinstance(permitted, dict):
            names = {
                d["resourceName"]
                for key in ("pciHostDevices", "mediatedDevices")
                for d in permitted.get(key) or []
                if isinstance(d, dict) and d.get("resourceName")
            }
        key = (meta.get("namespace", ""), meta.get("name", ""))
        self.kubevirts[key] = names
        self._raw_versions["KubeVirt"][key] = version(meta.get("resourceVersion"))
        self._changed = True

    def remove_kubevirt(self, namespace: str, name: str, resource_version: str | None = None) -> None:
        self._changed = self.kubevirts.pop((namespace, name), None) is not None
        self._bury_raw("KubeVirt", (namespace, name), resource_version)

    def upsert_namespace(self, body: dict[str, Any]) -> None:
        meta = body.get("metadata", {})
        if not self._admit_raw("Namespace", meta.get("name", ""), meta):
            return
        name = meta.get("name", "")
        self.namespaces[name] = dict(meta.get("labels") or {})
        self._namespaces_touched.add(name)
        # A budget that took the namespace up or let it go has a new use to report (§9).
        moved = self._budgets.relabel(name, self.namespace_labels(name), self._use.get(name, {}))
        self._namespaces_touched |= {key[0] for key in moved}
        self._raw_versions["Namespace"][name] = version(meta.get("resourceVersion"))
        self._changed = True

    def remove_namespace(self, name: str, resource_version: str | None = None) -> None:
        self._changed = self.namespaces.pop(name, None) is not None
        if self._changed:
            moved = self._budgets.namespace_gone(name, self._use.get(name, {}))
            self._namespaces_touched |= {key[0] for key in moved}
        self._bury_raw("Namespace", name, resource_version)

    # -- resyncs (§6.4) -------------------------------------------------------

    def _stored(self, kind: str) -> Mapping[Any, Any]:
        """What the view holds of `kind`, by key (objects with metadata, NodeInfos, or plain versions)."""
        match kind:
            case "GPUDevice":
                return self.devices
            case "GPUClass":
                return self.classes
            case "GPUBudget":
                return self.budgets
            case "GPUNode":
                return self.gpunodes
            case "Node":
                return self.nodes
            case _:
                return self._raw_versions[kind]

    @staticmethod
    def _version_of(stored: Any) -> int:
        if isinstance(stored, int):
            return stored
        if isinstance(stored, NodeInfo):
            return version(stored.resource_version)
        return version(stored.metadata.resource_version)

    def holds(self, kind: str, key: Any, resource_version: str | None) -> bool:
        """Whether the view already holds this object at exactly this version: a resync skips it unread."""
        if kind == "Pod":
            pod = self.pods.get(*key)
            return pod is not None and pod.resource_version == version(resource_version)
        stored = self._stored(kind).get(key)
        return stored is not None and self._version_of(stored) == version(resource_version)

    def stored_version(self, kind: str, key: Any) -> int | None:
        """The version of the object of this kind and key the view holds, None if it holds none."""
        if kind == "Pod":
            pod = self.pods.get(*key)
            return pod.resource_version if pod is not None else None
        stored = self._stored(kind).get(key)
        return None if stored is None else self._version_of(stored)

    def knows(self, kind: str, key: Any) -> bool:
        """Whether the view holds an object of this kind and key, at any version."""
        return self.pods.get(*key) is not None if kind == "Pod" else key in self._stored(kind)

    def missing(self, kind: str, listed: set[Any], list_version: str | None) -> list[Any]:
        """Keys of `kind` the view holds that a list at `list_version` lacks, stored at a version no newer.

        Such an object was removed while no watch event could say so (the start-up race between two
        lists, a watch gap); what is newer than the list arrived after it and stays."""
        if kind == "Pod":
            return self.pods.missing(listed, list_version)
        limit = version(list_version)
        return sorted(
            (k for k, v in self._stored(kind).items() if k not in listed and self._version_of(v) <= limit), key=str
        )

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
