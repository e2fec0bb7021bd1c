"""Nodes and their free units per resource, ordered for best fit (§5.1, §5.3, §13.1).

Callers: `state.indexers` stores nodes here and counts each Bound device's units against its node
(`count`, `uncount`) and the units pods the operator did not place hold (`set_unmanaged`, §12);
placement reads `best_fit`, `most_units`, `nodes_with` and, per class, `serving` (`state.serving`)
through its read side, `CapacityReads` (`Cluster.capacity`). Every resource's nodes are kept ordered by free units, so
best fit costs O(log n), never a scan, and by reach (free units plus those idle held devices hold,
which §5.7 may move away: `reach_fit`). Free units that change are news for waiting devices:
`take_room` hands out the classes where one may fit now (§5.5), or may with idle moves (§5.7).
Idle devices are also kept in the order they turned idle (`turned_idle`), so the binder's mover learns
when each becomes movable however it turned idle: detached, placed, moved, or found so in a list.
A device a decision moves keeps its units on the node it leaves until the move's write is settled
(`keep_origin`, `release_origin`): a move whose outcome is unknown frees nothing (§13.1).
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping

from cozygpu.api import GPUClass, IdleMoves
from cozygpu.state.counts import add as _add
from cozygpu.state.devices import DeviceKey
from cozygpu.state.nodes import NodeInfo
from cozygpu.state.serving import ServingIndex
from cozygpu.state.store import Store, writes
from cozygpu.state.tombstones import DEFAULT_LIMIT


class Capacity:
    def __init__(
        self,
        classes: Mapping[str, GPUClass],
        tombstones: int = DEFAULT_LIMIT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._classes = classes
        self._clock = clock
        self.nodes: Store[str, NodeInfo] = Store(tombstones)
        # Nodes taken out of service (spec.unschedulable): what is idle there leaves them (§6.8).
        self.cordoned: set[str] = set()
        # Nodes by the resources in their allocatable: placement looks only at nodes that have them.
        self._nodes_by_resource: dict[str, set[str]] = defaultdict(set)
        # Per resource, how many nodes serve each count of units: the largest a node has, without a scan (§3.7).
        self._unit_sizes: dict[str, dict[int, int]] = defaultdict(dict)
        # Units of Bound devices per node and resource, each device as it was counted, per class.
        self._held_res: dict[str, dict[str, int]] = {}
        self._counted: dict[DeviceKey, tuple[str, str, int, str, bool]] = {}
        # Of those, the units idle held devices hold that §5.7 may move (their class allows it).
        self._idle_res: dict[str, dict[str, int]] = {}
        # Since when (the clock's reading) each idle device has been idle on its node (§5.7), and the same in
        # that order: when a device may first move is news however it turned idle (`turned_idle`).
        self._idle_since: dict[DeviceKey, tuple[str, float]] = {}
        self._idle_order: list[tuple[float, DeviceKey]] = []
        # Units of moved devices kept on the node they leave until their write settles (§13.1).
        self._origin_res: dict[str, dict[str, int]] = {}
        self._origins: dict[DeviceKey, tuple[str, str, int]] = {}
        # Reach before this change, per (resource, node) it touched: `take_room` tells a rise alone.
        self._reach_before: dict[tuple[str, str], int | None] = {}
        self._held_class: dict[str, int] = {}
        # Units pods the operator did not place hold per node and resource (§12): not free either.
        self._unmanaged_res: dict[str, dict[str, int]] = {}
        # Every resource's nodes ordered by free units, and each node's place in that order.
        self._by_free: dict[str, list[tuple[int, str]]] = defaultdict(list)
        self._free_at: dict[tuple[str, str], int] = {}
        # And by reach: free plus idle units (§5.7), where idle moves could make room.
        self._by_reach: dict[str, list[tuple[int, str]]] = defaultdict(list)
        self._reach_at: dict[tuple[str, str], int] = {}
        # Per class, the nodes serving it by free units, and the others with its resource (§5.1, §5.3).
        self.serving = ServingIndex()
        self._room: set[str] = set()
        self._served: set[str] = set()
        self._reach: set[str] = set()

    @writes
    def take_room(self) -> tuple[set[str], set[str], set[str]]:
        """The classes where a waiting device may fit now, those whose serving nodes changed, and those where one
        may fit with idle moves now (§5.7), since last asked."""
        for (resource, node), before in self._reach_before.items():
            now = self._reach_at.get((resource, node))
            if now is not None and (before is None or now > before):
                self._reach |= self.serving.served_with(node, resource)
        room, served, reach = self._room, self._served, self._reach
        self._room, self._served, self._reach, self._reach_before = set(), set(), set(), {}
        return room, served, reach

    # -- writes (the cluster's only) ---------------------------------------------

    @writes
    def put_node(self, node: NodeInfo) -> bool:
        """Store the node; whether anything a decision reads changed (a heartbeat changes nothing)."""
        old = self.nodes.put(node.name, node, node.resource_version)
        (self.cordoned.add if node.unschedulable else self.cordoned.discard)(node.name)
        self._unindex_node(old)
        for resource, units in node.allocatable.items():
            self._nodes_by_resource[resource].add(node.name)
            _add(self._unit_sizes[resource], units, 1)
        for resource in set(node.allocatable) | set(old.allocatable if old else ()):
            self._reorder(node.name, resource)
        if old is None or dataclasses.replace(old, resource_version=node.resource_version) != node:
            self._node_changed(old, node)
            return True
        return False

    def _node_changed(self, old: NodeInfo | None, new: NodeInfo | None) -> None:
        started, reasons = self.serving._node_changed(old, new, self._classes, self.free_units)
        self._room |= started  # a node that began serving a class: its free units wake what fits (§5.5)
        self._served |= reasons

    @writes
    def pop_node(self, name: str, removal: str | None) -> NodeInfo | None:
        old = self.nodes.pop(name, removal)
        self.cordoned.discard(name)
        self._unindex_node(old)
        self._node_changed(old, None)
        for resource in old.allocatable if old else ():
            self._reorder(name, resource)
        return old

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

    @writes
    def count(self, key: DeviceKey, node: str, class_name: str, units: int, idle: bool = False) -> None:
        """A Bound device's units against its node and its class's resource, as known now; `idle`: a
        reservation no guest uses (`GPUDevice.idle`), which §5.7 may move unless its class says Never."""
        cls = self._classes.get(class_name)
        if cls is None:
            return  # counted once its class is known (the cluster counts the class's devices anew)
        resource = cls.spec.resource_name
        idle = idle and cls.spec.idle_moves is IdleMoves.ALLOWED
        self._counted[key] = (node, resource, units, class_name, idle)
        per_node = self._held_res.setdefault(node, {})
        per_node[resource] = per_node.get(resource, 0) + units
        if idle:
            _add(self._idle_res.setdefault(node, {}), resource, units)
            if self._idle_since.get(key, ("", 0.0))[0] != node:  # idle from now, or anew on another node
                self._idle_from(key, node, self._clock())
        else:
            self._idle_from(key, None)
        self._held_class[class_name] = self._held_class.get(class_name, 0) + units
        self._reorder(node, resource)

    @writes
    def uncount(self, key: DeviceKey) -> None:
        counted = self._counted.pop(key, None)
        if counted is None:
            return
        node, resource, units, class_name, idle = counted
        _add(self._held_class, class_name, -units)
        if idle:
            _add(self._idle_res[node], resource, -units)
            if not self._idle_res[node]:
                del self._idle_res[node]
        per_node = self._held_res[node]
        per_node[resource] -= units
        if not per_node[resource]:
            del per_node[resource]
            if not per_node:
                del self._held_res[node]
        self._reorder(node, resource)

    @writes
    def forget(self, key: DeviceKey) -> None:
        """The device is gone: uncounted, and nothing kept of it."""
        self.uncount(key)
        self._idle_from(key, None)
        self.release_origin(key)

    def _idle_from(self, key: DeviceKey, node: str | None, since: float = 0.0) -> None:
        """The device is idle on `node` from `since` (None: not idle), in both indexes."""
        old = self._idle_since.pop(key, None)
        if old is not None:
            del self._idle_order[bisect.bisect_left(self._idle_order, (old[1], key))]
        if node is not None:
            self._idle_since[key] = (node, since)
            bisect.insort(self._idle_order, (since, key))

    @writes
    def keep_origin(self, key: DeviceKey) -> None:
        """A decision moves the counted device: its units stay taken on the node it leaves until `release_origin`."""
        counted = self._counted.get(key)
        if counted is None or key in self._origins:
            return
        node, resource, units = counted[:3]
        self._origins[key] = (node, resource, units)
        _add(self._origin_res.setdefault(node, {}), resource, units)
        self._reorder(node, resource)

    @writes
    def release_origin(self, key: DeviceKey) -> str | None:
        """The move's write is settled: the API's answer says where the units are. The node it freed, if any."""
        kept = self._origins.pop(key, None)
        if kept is None:
            return None
        node, resource, units = kept
        _add(self._origin_res[node], resource, -units)
        if not self._origin_res[node]:
            del self._origin_res[node]
        self._reorder(node, resource)
        return node

    @writes
    def set_unmanaged(self, node: str, now: dict[str, int]) -> None:
        """The units pods the operator did not place hold on the node now, per resource."""
        before = self._unmanaged_res.pop(node, {})
        if now:
            self._unmanaged_res[node] = now
        if now != before:
            for resource in set(now) | set(before):
                self._reorder(node, resource)

    @writes
    def readied(self, class_name: str) -> None:
        """A class became ready, or stopped being (§12.3): its waiting devices are decided again."""
        self._served.add(class_name)

    @writes
    def reserve(self) -> None:
        """A class changed: which node serves what is judged anew everywhere; every class may read anew."""
        every = self.serving._rebuild(self.nodes.items.values(), self._classes, self.free_units)
        self._room |= every
        self._served |= every

    def _reorder(self, node: str, resource: str) -> None:
        """Put (free, node) and (reach, node) where they belong in the resource's orders, or take them out."""
        old = _unplace(self._by_free, self._free_at, resource, node)
        old_reach = _unplace(self._by_reach, self._reach_at, resource, node)
        self._reach_before.setdefault((resource, node), old_reach)
        info = self.nodes.get(node)
        if info is not None and resource in info.allocatable:
            taken = sum(units.get(node, {}).get(resource, 0) for units in self._taking())
            now = info.free(resource, taken)
            reach = now + self._idle_res.get(node, {}).get(resource, 0)
            _place(self._by_free, self._free_at, resource, node, now)
            _place(self._by_reach, self._reach_at, resource, node, reach)
            if now != old:
                self._room |= self.serving._units_changed(node, resource, now)

    def _taking(self) -> tuple[dict[str, dict[str, int]], ...]:
        """Per node and resource, what takes units: Bound devices, pods the operator did not place, moves in flight."""
        return self._held_res, self._unmanaged_res, self._origin_res

    # -- reads -------------------------------------------------------------------

    def free_units(self, node: str, resource: str) -> int:
        return self._free_at.get((resource, node), 0)

    def has_unmanaged(self, node: str) -> bool:
        return node in self._unmanaged_res

    def unmanaged_nodes(self) -> list[str]:
        return list(self._unmanaged_res)

    def held_of_class(self, class_name: str) -> int:
        """Units of the class's Bound devices, on every node (counted once the class is known)."""
        return self._held_class.get(class_name, 0)

    def held_units(self, node: str) -> dict[str, int]:
        """Units held on the node per resource by Bound devices (of every namespace)."""
        return dict(self._held_res.get(node, {}))

    def unmanaged_units(self, node: str) -> dict[str, int]:
        """Units pods the operator did not place hold on the node, per resource (§12; `Cluster.pods.unmanaged_on`)."""
        return dict(self._unmanaged_res.get(node, {}))

    def taken_units(self, node: str) -> dict[str, int]:
        """Units not free on the node per resource: held by Bound devices, by pods the operator did not place, or
        by a device whose move away is still being written."""
        taken: dict[str, int] = {}
        for per_node in self._taking():
            for resource, units in per_node.get(node, {}).items():
                taken[resource] = taken.get(resource, 0) + units
        return taken

    def idle_for(self, key: DeviceKey) -> float | None:
        """Seconds since the device turned idle where it is (§5.7), by the view's clock; None: not idle."""
        since = self._idle_since.get(key)
        return self._clock() - since[1] if since is not None else None

    def idle_clock(self) -> float:
        """The clock idle times are read by (`idle_for`, `turned_idle`)."""
        return self._clock()

    def turned_idle(self, after: float, until: float) -> set[str]:
        """The classes served, with their resource, on the nodes of the devices that turned idle in (`after`,
        `until`] by `idle_clock` and are idle there still: O(log n) plus those devices."""
        order = self._idle_order
        out: set[str] = set()
        for index in range(bisect.bisect_right(order, after, key=_first), len(order)):
            since, key = order[index]
            if since > until:
                break
            counted = self._counted.get(key)
            if counted is not None and counted[4]:  # counted idle, on the node it turned idle on
                out |= self.serving.served_with(counted[0], counted[1])
        return out

    def next_idle(self, after: float) -> float | None:
        """When the first device that turned idle after `after` (by `idle_clock`) did, if any: O(log n)."""
        order = self._idle_order
        index = bisect.bisect_right(order, after, key=_first)
        return order[index][0] if index < len(order) else None

    def best_fit(self, resource: str, units: int) -> Iterator[str]:
        """Nodes with at least `units` free of the resource, fewest free first, then by name: where
        bin-packing puts a new set of that one resource (§5.3), found in O(log n)."""
        order = self._by_free.get(resource, [])
        for index in range(bisect.bisect_left(order, (units, "")), len(order)):
            yield order[index][1]

    def reach_fit(self, resource: str, units: int) -> Iterator[str]:
        """Nodes whose free units plus idle held units (§5.7) of the resource come to at least `units`, least
        first, then by name: where idle moves could make room, found in O(log n)."""
        order = self._by_reach.get(resource, [])
        for index in range(bisect.bisect_left(order, (units, "")), len(order)):
            yield order[index][1]

    def most_units(self, resource: str) -> int:
        """The most units of `resource` any one node serves (0 if none): over the distinct sizes, not the nodes."""
        return max(self._unit_sizes.get(resource, {0: 1}))

    def nodes_with(self, resources: Iterable[str]) -> list[str]:
        """Names of the nodes whose allocatable names every one of the resources, sorted."""
        sets = [self._nodes_by_resource.get(r, set()) for r in resources]
        if not sets:
            return []
        return sorted(set.intersection(*sets))


def _first(entry: tuple[float, DeviceKey]) -> float:
    return entry[0]


def _unplace(
    orders: dict[str, list[tuple[int, str]]], at: dict[tuple[str, str], int], resource: str, node: str
) -> int | None:
    """Take the node out of the resource's order; what it had there (None: it was not in it)."""
    old = at.pop((resource, node), None)
    if old is not None:
        order = orders[resource]
        del order[bisect.bisect_left(order, (old, node))]
        if not order:
            del orders[resource]
    return old


def _place(
    orders: dict[str, list[tuple[int, str]]], at: dict[tuple[str, str], int], resource: str, node: str, units: int
) -> None:
    bisect.insort(orders[resource], (units, node))
    at[(resource, node)] = units


class CapacityReads:
    """The capacity part as workers and decisions read it (`Cluster.capacity`): nodes, the units each serves and
    holds, best fit and reach (§5.3, §5.7), idle times, and the nodes taken out of service (§6.8)."""

    def __init__(self, part: Capacity) -> None:
        self._part = part
        self.nodes: Mapping[str, NodeInfo] = part.nodes.items
        self.serving = part.serving
        self.held_of_class = part.held_of_class
        self.held_units = part.held_units
        self.unmanaged_units = part.unmanaged_units
        self.taken_units = part.taken_units
        self.best_fit = part.best_fit
        self.reach_fit = part.reach_fit
        self.most_units = part.most_units
        self.nodes_with = part.nodes_with
        self.idle_for = part.idle_for
        self.idle_clock = part.idle_clock
        self.turned_idle = part.turned_idle
        self.next_idle = part.next_idle

    def cordoned(self) -> frozenset[str]:
        """Nodes taken out of service (spec.unschedulable), kept per node event: what is idle there leaves (§6.8).
        A copy, to walk; `is_cordoned` and `any_cordoned` ask without one (per event, per node status)."""
        return frozenset(self._part.cordoned)

    def is_cordoned(self, node: str) -> bool:
        return node in self._part.cordoned

    def any_cordoned(self) -> bool:
        return bool(self._part.cordoned)
