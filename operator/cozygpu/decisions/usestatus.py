"""GPUBudget status (§1.4, §7.3) and GPUClass status (§1.1), from the cluster view.

`class_status` computes a class's status from scratch, walking the nodes with its
resource; `ClassTotals` keeps the same figures per node as the view changes (the
accountant feeds it the nodes each change touched), so a status costs what changed,
not the cluster's size (§13). A property test holds the two equal.
"""

from __future__ import annotations

import datetime as dt
import heapq

from cozygpu.api import Condition, ConditionStatus, GPUBudget, GPUClass, kinds
from cozygpu.api.gpubudget import GPUBudgetStatus
from cozygpu.api.gpuclass import MAX_CLASS_NODES, GPUClassStatus
from cozygpu.api.names import CONDITION_OVER_BUDGET
from cozygpu.decisions.capacity import served_classes, taken
from cozygpu.decisions.orders import in_flight, live, settle
from cozygpu.state.cluster import Cluster


def budget_status(cluster: Cluster, budget: GPUBudget, now: dt.datetime) -> GPUBudgetStatus:
    """Units used per class and in total; OverBudget when a lowered cap is below what is held (kept, §7.3); the
    orders recorded on it (§7.4) less those the count has taken up (`countedThrough` says how far it went), or
    that expired by `now`; the units replicas set aside, less those that expired."""
    used = cluster.budgets.use(*budget.key)  # this view's own count: the one a replica behind falls back on
    total = sum(used.values())
    over = [
        f"GPUClass {c}: {used.get(c, 0)} used, limit {n}"
        for c, n in sorted(budget.spec.limits.items())
        if used.get(c, 0) > n
    ]
    if budget.spec.total is not None and total > budget.spec.total:
        over.append(f"total: {total} used, limit {budget.spec.total}")
    before = next((c for c in budget.status.conditions if c.type == CONDITION_OVER_BUDGET), None)
    state = ConditionStatus.TRUE if over else ConditionStatus.FALSE
    since = before.last_transition_time if before is not None and before.status == state else now
    condition = Condition(
        type=CONDITION_OVER_BUDGET,
        status=state,
        reason="LimitBelowUse" if over else "WithinLimits",
        message=("what is held is kept; new orders are refused: " + "; ".join(over)) if over else "",
        last_transition_time=since,
    )
    orders, _ = settle(cluster, budget.status.orders, now, lambda namespace, name, uid: False, counting=True)
    aside = live(budget.status.set_aside, now)  # the replicas' to write; expired ones go
    return GPUBudgetStatus(
        used={c: n for c, n in sorted(used.items()) if n},
        used_total=total,
        conditions=[condition],
        orders=orders,
        ordered_total=in_flight(orders),
        set_aside=aside,
        set_aside_total=in_flight(aside),
        counted_through=str(cluster.progress(kinds.GPU_DEVICE)),
    )


def class_status(cluster: Cluster, cls: GPUClass) -> GPUClassStatus:
    """The nodes that serve the class and their units of its resource (informational)."""
    resource = cls.spec.resource_name
    nodes, allocatable, taken_units = [], 0, 0
    for name in cluster.capacity.nodes_with([resource]):
        node = cluster.capacity.nodes[name]
        if all(c.name != cls.name for c in served_classes(cluster, node)):
            continue
        nodes.append(name)
        allocatable += node.units(resource)
        taken_units += taken(cluster, name).get(resource, 0)
    return GPUClassStatus(
        nodes=sorted(nodes)[:MAX_CLASS_NODES],
        node_count=len(nodes),
        allocatable=allocatable,
        held=cluster.capacity.held_of_class(cls.name),
        free=max(0, allocatable - taken_units),
        conditions=cls.status.conditions,
    )


class ClassTotals:
    """Per class: the nodes that serve it, and their allocatable and taken units of its resource, kept from
    what each node adds (`node_changed`), so `status` needs no walk over the nodes."""

    def __init__(self) -> None:
        self._share: dict[str, dict[str, tuple[int, int]]] = {}  # node -> class -> (allocatable, taken)
        self._nodes: dict[str, set[str]] = {}
        self._named: dict[str, list[str]] = {}  # the first names of `_nodes`, kept until a node joins or leaves
        self._units: dict[str, tuple[int, int]] = {}

    def node_changed(self, cluster: Cluster, name: str) -> set[str]:
        """The node's share again; returns the classes whose totals moved."""
        node = cluster.capacity.nodes.get(name)
        new: dict[str, tuple[int, int]] = {}
        if node is not None:
            node_taken = taken(cluster, name)
            for cls in served_classes(cluster, node):
                resource = cls.spec.resource_name
                new[cls.name] = (node.units(resource), node_taken.get(resource, 0))
        old = self._share.pop(name, {})
        if new:
            self._share[name] = new
        moved = set()
        for class_name in old.keys() | new.keys():
            before, after = old.get(class_name), new.get(class_name)
            if before == after:
                continue
            moved.add(class_name)
            allocatable, taken_units = self._units.get(class_name, (0, 0))
            nodes = self._nodes.setdefault(class_name, set())
            if (before is None) != (after is None):
                self._named.pop(class_name, None)  # a node began or stopped serving: names again
            if before is not None:
                allocatable, taken_units = allocatable - before[0], taken_units - before[1]
                nodes.discard(name)
            if after is not None:
                allocatable, taken_units = allocatable + after[0], taken_units + after[1]
                nodes.add(name)
            self._units[class_name] = (allocatable, taken_units)
        return moved

    def status(self, cluster: Cluster, cls: GPUClass) -> GPUClassStatus:
        """`class_status`, from the totals."""
        allocatable, taken_units = self._units.get(cls.name, (0, 0))
        nodes = self._nodes.get(cls.name, set())
        named = self._named.get(cls.name)
        if named is None:
            named = self._named[cls.name] = heapq.nsmallest(MAX_CLASS_NODES, nodes)
        return GPUClassStatus(
            nodes=list(named),
            node_count=len(nodes),
            allocatable=allocatable,
            held=cluster.capacity.held_of_class(cls.name),
            free=max(0, allocatable - taken_units),
            conditions=cls.status.conditions,
        )
