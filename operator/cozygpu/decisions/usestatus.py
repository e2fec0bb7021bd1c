"""GPUBudget status (§1.4, §7.3) and GPUClass status (§1.1), from the cluster view."""

from __future__ import annotations

import datetime as dt

from cozygpu.api import Condition, ConditionStatus, GPUBudget, GPUClass
from cozygpu.api.gpubudget import GPUBudgetStatus
from cozygpu.api.gpuclass import GPUClassStatus
from cozygpu.api.names import CONDITION_OVER_BUDGET
from cozygpu.decisions.budgets import usage
from cozygpu.decisions.capacity import served_classes, taken
from cozygpu.state.cluster import Cluster


def budget_status(cluster: Cluster, budget: GPUBudget, now: dt.datetime) -> GPUBudgetStatus:
    """Units used per class and in total; OverBudget when a lowered cap is below what is held (kept, §7.3)."""
    used = usage(cluster, budget)
    total = sum(used.values())
    over = [f"GPUClass {c}: {used.get(c, 0)} used, limit {n}" for c, n in sorted(budget.spec.limits.items())
            if used.get(c, 0) > n]  # fmt: skip
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
    return GPUBudgetStatus(used={c: n for c, n in sorted(used.items()) if n}, used_total=total, conditions=[condition])


def class_status(cluster: Cluster, cls: GPUClass) -> GPUClassStatus:
    """The nodes that serve the class and their units of its resource (informational)."""
    resource = cls.spec.resource_name
    nodes, allocatable, taken_units = [], 0, 0
    for name in cluster.nodes_with([resource]):
        node = cluster.nodes[name]
        if all(c.name != cls.name for c in served_classes(cluster, node)):
            continue
        nodes.append(name)
        allocatable += node.units(resource)
        taken_units += taken(cluster, name).get(resource, 0)
    mine = sum(d.spec.count for d in cluster.devices_of_class(cls.name) if d.holds_gpus)
    return GPUClassStatus(
        nodes=nodes, allocatable=allocatable, held=mine, free=max(0, allocatable - taken_units),
        conditions=cls.status.conditions,
    )  # fmt: skip
