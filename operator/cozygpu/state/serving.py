"""Which nodes serve each GPUClass (§5.1, §8.2), kept as an index ordered by free units.

The rule "a node serves a class" lives here, below the decisions, so the view can keep
it current as events arrive: Ready, schedulable, every blocking taint tolerated, the
class's nodeSelector matched, some units of its resource, and no class conflict.
`ServingIndex` keeps, per class, the serving nodes by free units of the class's
resource (best fit, §5.3) and, by name, the nodes that have the resource but do not
serve the class. The binder finds the node for a device, or that none has room, in
O(log n), and names the closest nodes without a scan (§14.3).

Kept by `state.capacity` alone (its writes are private to the view: workers read it through
`Cluster.capacity.serving`); the cluster hands what moved to the workers as a
`Change`: `room` (classes where a waiting device may fit now) and `served` (classes
whose set of serving nodes changed, so their waiting devices' reasons read differently).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping

from cozygpu.api import GPUClass, GPUMode
from cozygpu.state.nodes import NodeInfo, node_selector_matches, untolerated

Free = Callable[[str, str], int]  # (node, resource) -> free units now


def matching(node: NodeInfo, classes: Iterable[GPUClass]) -> list[GPUClass]:
    """Classes whose nodeSelector the node's labels satisfy and whose resource it has, by name."""
    return sorted(
        (
            c
            for c in classes
            if node_selector_matches(c.spec.node_selector, node.labels) and c.spec.resource_name in node.allocatable
        ),
        key=lambda c: c.name,
    )


def conflicts(classes: list[GPUClass]) -> set[str]:
    """§8.2: passthrough next to vGPU, or one resource name under two modes: all in the clash conflict."""
    modes = {c.spec.mode for c in classes}
    if len(modes) > 1:
        return {c.name for c in classes}
    by_resource: dict[str, set[GPUMode]] = defaultdict(set)
    for c in classes:
        by_resource[c.spec.resource_name].add(c.spec.mode)
    clashing = {r for r, m in by_resource.items() if len(m) > 1}
    return {c.name for c in classes if c.spec.resource_name in clashing}


def refusal(node: NodeInfo, cls: GPUClass, served: frozenset[str]) -> str | None:
    """§5.1 but the free-units test: why the node takes no new device of the class, None if it may.
    `served`: the classes the node serves (`serving`), which tells a class conflict apart."""
    if not node.ready:
        return f"node {node.name} is not Ready"
    if node.unschedulable:
        return f"node {node.name} is cordoned"
    blocking = untolerated(cls.spec.tolerations, node.taints)
    if blocking:
        t = blocking[0]
        return f"node {node.name} has taint {t.key}={t.value}:{t.effect} that GPUClass {cls.name} does not tolerate"
    if not node_selector_matches(cls.spec.node_selector, node.labels):
        return f"node {node.name} does not match the nodeSelector of GPUClass {cls.name}"
    if node.units(cls.spec.resource_name) == 0:
        return f"node {node.name} has no {cls.spec.resource_name}"
    if cls.name not in served:
        return f"node {node.name} has a class conflict for GPUClass {cls.name}"
    return None


def serving(node: NodeInfo, classes: Iterable[GPUClass]) -> frozenset[str]:
    """The names of the classes the node serves for new placements."""
    candidates = matching(node, classes)
    clash = conflicts(candidates)
    ok = frozenset(c.name for c in candidates if c.name not in clash)
    return frozenset(c.name for c in candidates if c.name in ok and refusal(node, c, ok) is None)


class ServingIndex:
    """Per class, its serving nodes by (free units, name) and the other nodes with its resource by name."""

    def __init__(self) -> None:
        self._serves: dict[str, frozenset[str]] = {}  # node -> classes it serves
        self._order: dict[str, list[tuple[int, str]]] = {}  # class -> (free, node), ascending
        self._free: dict[tuple[str, str], int] = {}  # (class, node) -> its free units in the order
        self._unserved: dict[str, list[str]] = {}  # class -> nodes with its resource that do not serve it
        self._resource: dict[str, str] = {}  # class -> its resource
        self._classes_of: dict[str, set[str]] = defaultdict(set)  # resource -> classes

    # -- what moves it ---------------------------------------------------------

    def _node_changed(
        self, old: NodeInfo | None, new: NodeInfo | None, classes: Mapping[str, GPUClass], free: Free
    ) -> tuple[set[str], set[str]]:
        """A node appeared, changed or went: the classes it started serving (room: its free units), and those whose
        waiting devices read another reason now (no node had the class's resource and one has, or the other way
        round: `placement._unplaced`). A node that stopped serving, or one of many that has the resource, changes
        no waiting device's prospects nor its reason: a flap must not cost a decision per waiting device of a class
        thousands wait for. Room on a node that serves a class before and after comes through `free`. Costs the
        classes of its resources, not the nodes."""
        node = new if new is not None else old
        if node is None:
            return set(), set()
        name = node.name
        before = self._serves.pop(name, frozenset())
        after = serving(new, classes.values()) if new is not None else frozenset()
        if after:
            self._serves[name] = after
        touched = set(before) | set(after)
        for r in set(old.allocatable if old else ()) | set(new.allocatable if new else ()):
            touched |= self._classes_of.get(r, set())
        had = {c for c in touched if any(self.counts(c))}
        for c in touched:
            self._leave(c, name)
            if c in after:
                self._enter(c, name, free(name, self._resource[c]))
            elif new is not None and self._resource.get(c) in new.allocatable:
                bisect.insort(self._unserved.setdefault(c, []), name)
        return set(after - before), {c for c in touched if any(self.counts(c)) != (c in had)}

    def _units_changed(self, node: str, resource: str, now: int) -> set[str]:
        """The node's free units of the resource moved to `now`: the classes that gained room."""
        room = set()
        for c in self._serves.get(node, ()):
            if self._resource[c] != resource:
                continue
            was = self._free.get((c, node))
            if was == now:
                continue
            self._leave(c, node)
            self._enter(c, node, now)
            if was is None or now > was:
                room.add(c)
        return room

    def _rebuild(self, nodes: Iterable[NodeInfo], classes: Mapping[str, GPUClass], free: Free) -> set[str]:
        """A class appeared, changed or went: every node is judged again (O(nodes x classes); classes are
        an administrator's, rarely changed). Returns every class before and after, all may read anew."""
        everything = set(self._resource) | set(classes)
        for index in (self._serves, self._order, self._free, self._unserved, self._resource, self._classes_of):
            index.clear()
        for c in classes.values():
            self._resource[c.name] = c.spec.resource_name
            self._classes_of[c.spec.resource_name].add(c.name)
        for node in nodes:
            self._node_changed(None, node, classes, free)
        return everything

    def _enter(self, cls: str, node: str, free: int) -> None:
        bisect.insort(self._order.setdefault(cls, []), (free, node))
        self._free[(cls, node)] = free

    def _leave(self, cls: str, node: str) -> None:
        was = self._free.pop((cls, node), None)
        if was is not None:
            order = self._order[cls]
            del order[bisect.bisect_left(order, (was, node))]
            if not order:
                del self._order[cls]
        names = self._unserved.get(cls)
        if names:
            at = bisect.bisect_left(names, node)
            if at < len(names) and names[at] == node:
                del names[at]
                if not names:
                    del self._unserved[cls]

    # -- what it answers -------------------------------------------------------

    def serves(self, node: str) -> frozenset[str]:
        """The classes the node serves for new placements."""
        return self._serves.get(node, frozenset())

    def served_with(self, node: str, resource: str) -> set[str]:
        """The classes of the resource the node serves."""
        return {c for c in self._serves.get(node, ()) if self._resource.get(c) == resource}

    def best_fit(self, cls: str, units: int) -> Iterator[str]:
        """Serving nodes with at least `units` free, fewest free first, then by name (§5.3): O(log n) to the first."""
        order = self._order.get(cls, [])
        for index in range(bisect.bisect_left(order, (units, "")), len(order)):
            yield order[index][1]

    def most_free(self, cls: str) -> int:
        """The most free units any serving node has for the class (0 if none serves it)."""
        order = self._order.get(cls)
        return order[-1][0] if order else 0

    def fullest_first(self, cls: str, limit: int) -> list[tuple[int, str]]:
        """Up to `limit` serving nodes with the most free units, most first, then by name: the closest misses."""
        order = self._order.get(cls, [])
        out: list[tuple[int, str]] = []
        end = len(order)
        while end and len(out) < limit:
            units = order[end - 1][0]
            start = bisect.bisect_left(order, (units, ""))
            out.extend(order[start:end][: limit - len(out)])
            end = start
        return out

    def unserved(self, cls: str, limit: int) -> list[str]:
        """The first `limit` nodes by name that have the class's resource but do not serve it."""
        return self._unserved.get(cls, [])[:limit]

    def counts(self, cls: str) -> tuple[int, int]:
        """(nodes serving the class, nodes with its resource that do not)."""
        return len(self._order.get(cls, ())), len(self._unserved.get(cls, ()))
