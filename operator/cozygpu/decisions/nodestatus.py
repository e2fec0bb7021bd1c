"""GPUNode status (§1.3, §8): what a node serves, holds and has lost, from the cluster view."""

from __future__ import annotations

import datetime as dt

from cozygpu.api import Condition, ConditionStatus, GPUNodeStatus, NodeResource
from cozygpu.api.names import CONDITION_CLASS_CONFLICT, CONDITION_LOST_CAPACITY
from cozygpu.decisions.capacity import conflicts, held, matching_classes
from cozygpu.state.cluster import Cluster


def _condition(
    type_: str, true: bool, *, reason: str, message: str, previous: list[Condition], now: dt.datetime
) -> Condition:
    status = ConditionStatus.TRUE if true else ConditionStatus.FALSE
    before = next((c for c in previous if c.type == type_), None)
    since = before.last_transition_time if before is not None and before.status == status else now
    return Condition(type=type_, status=status, reason=reason, message=message, last_transition_time=since)


def gpunode_status(cluster: Cluster, name: str, previous: list[Condition], now: dt.datetime) -> GPUNodeStatus | None:
    """The status to write, or None when the node serves no class and no device names it."""
    node = cluster.nodes.get(name)
    devices = list(cluster.devices_on(name))
    bound = [d for d in devices if d.holds_gpus]
    matching = matching_classes(cluster, node) if node is not None else []
    if not matching and not devices:
        return None
    clash = conflicts(matching)
    held_units = held(cluster, name)
    resource_names = sorted({c.spec.resource_name for c in matching} | set(held_units))
    resources = []
    for r in resource_names:
        allocatable = node.units(r) if node is not None else 0
        units = held_units.get(r, 0)
        resources.append(NodeResource(name=r, allocatable=allocatable, held=units, free=max(0, allocatable - units)))

    over = [r for r in resources if r.held > r.allocatable]
    if node is None and bound:
        lost, reason, message = True, "NodeGone", f"the node is gone with {len(bound)} devices bound to it"
    elif node is not None and not node.ready and bound:
        lost, reason, message = True, "NodeNotReady", f"the node is not Ready with {len(bound)} devices bound to it"
    elif over:
        lost, reason = True, "FewerUnitsThanHeld"
        message = "; ".join(f"{r.name}: {r.held} held, {r.allocatable} allocatable" for r in over)
    else:
        lost, reason, message = False, "CapacityIntact", ""
    conflict_names = sorted(clash)
    conditions = [
        _condition(CONDITION_LOST_CAPACITY, lost, reason=reason, message=message, previous=previous, now=now),
        _condition(
            CONDITION_CLASS_CONFLICT,
            bool(conflict_names),
            reason="ModesClash" if conflict_names else "NoConflict",
            message=("classes that cannot be served together: " + ", ".join(conflict_names)) if conflict_names else "",
            previous=previous,
            now=now,
        ),
    ]
    return GPUNodeStatus(
        resources=resources,
        classes=[c.name for c in matching if c.name not in clash],
        summary=", ".join(f"{r.name} {r.held}/{r.allocatable}" for r in resources),
        conditions=conditions,
    )
