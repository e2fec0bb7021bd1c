"""GPUNode status (§1.3, §8): what a node serves, holds and has lost, from the cluster view.

Besides the units of Bound devices, the status shows the units that pods the operator
did not place hold on the node (§12), as the view counts them (`Cluster.pods.unmanaged_on`:
a launcher is the operator's up to what its VMI's set holds on this very node; every
other pod's units are unmanaged). Only managed resources (the `resourceName` of any
GPUClass) and those the node's status lists are shown; other extended resources are
not the operator's business.
- Units that such pods take from what Bound devices hold (held + unmanaged above
  allocatable) are lost capacity (§1.3, §5.6): the devices are Bound to units a
  foreign pod is using, and their VMs cannot start there until it ends.
`free` is allocatable - held - unmanaged, what the binder counts (`Cluster.capacity.taken_units`).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict

from cozygpu.api import Condition, ConditionStatus, GPUNode, GPUNodeStatus, NodeResource, UnmanagedPod
from cozygpu.api.gpunode import MAX_UNMANAGED_PODS
from cozygpu.api.names import CONDITION_CLASS_CONFLICT, CONDITION_EVACUATION, CONDITION_LOST_CAPACITY
from cozygpu.decisions import evacuation
from cozygpu.decisions.capacity import conflicts, held, matching_classes
from cozygpu.state.cluster import Cluster

# Pods a LostCapacity message names, per crowded resource.
MAX_NAMED_PODS = 3


def _condition(
    type_: str, true: bool, *, reason: str, message: str, previous: list[Condition], now: dt.datetime
) -> Condition:
    status = ConditionStatus.TRUE if true else ConditionStatus.FALSE
    before = next((c for c in previous if c.type == type_), None)
    since = before.last_transition_time if before is not None and before.status == status else now
    return Condition(type=type_, status=status, reason=reason, message=message, last_transition_time=since)


def unmanaged_pods(cluster: Cluster, name: str, listed: set[str]) -> list[UnmanagedPod]:
    """The pods on the node holding units of managed or `listed` resources that no device the operator
    placed there accounts for (`Cluster.pods.unmanaged_on`), each with those units, by namespace and name."""
    watched = listed | {c.spec.resource_name for c in cluster.classes.values()}
    out = []
    for pod, extra in cluster.pods.unmanaged_on(name):
        mine = {r: n for r, n in extra.items() if r in watched}
        if mine:
            out.append(UnmanagedPod(pod=pod.ident, vmi=pod.vmi, units=mine))
    return out


def _crowded_message(crowded: list[NodeResource], pods: list[UnmanagedPod]) -> str:
    parts = []
    for r in crowded:
        names = [p.pod for p in pods if r.name in p.units]
        shown = ", ".join(names[:MAX_NAMED_PODS]) + (
            f" and {len(names) - MAX_NAMED_PODS} more" if len(names) > MAX_NAMED_PODS else ""
        )
        parts.append(
            f"{r.name}: {r.held} held by devices, {r.unmanaged} by pods the operator did not place ({shown}), "
            f"{r.allocatable} allocatable"
        )
    return "; ".join(parts)


def _evacuation(
    cluster: Cluster, name: str, previous: list[Condition], now: dt.datetime, *, stop_bare: bool, evacuated: int
) -> Condition:
    """§6.8: True while VMs marked off the node are still to leave it, saying which wait, which restart on the node
    reserved for them and which cannot leave (reason `Blocked`, with why), so a drain that waits says what for; and
    how many have left since the node was cordoned (`evacuated`), also once none is left to move."""
    ev = evacuation.of_node(cluster, name, stop_bare=stop_bare)
    moved = f"{_vms(evacuated)} moved off the node" if evacuated else ""
    if ev is None:
        reason = "Evacuated" if evacuated else "NoEvacuation"
        return _condition(CONDITION_EVACUATION, False, reason=reason, message=moved, previous=previous, now=now)
    parts = [f"blocked: {vmi}: {why}" for vmi, why in ev.blocked[:MAX_NAMED_PODS]]
    if len(ev.blocked) > MAX_NAMED_PODS:
        parts.append(f"and {len(ev.blocked) - MAX_NAMED_PODS} more blocked")
    if ev.waiting:
        parts.append(f"{_vms(len(ev.waiting))} to move: " + ", ".join(ev.waiting[:MAX_NAMED_PODS]))
    if ev.restarting:
        parts.append(f"{_vms(len(ev.restarting))} restarting on the nodes reserved for them")
    if moved:
        parts.append(moved)
    reason = "Blocked" if ev.blocked else "Evacuating"
    return _condition(CONDITION_EVACUATION, True, reason=reason, message="; ".join(parts), previous=previous, now=now)


def _vms(count: int) -> str:
    return f"{count} VM" if count == 1 else f"{count} VMs"


def gpunode_status(
    cluster: Cluster,
    name: str,
    previous: list[Condition],
    now: dt.datetime,
    *,
    stop_bare: bool = False,
    evacuated: int = 0,
) -> GPUNodeStatus | None:
    """The status to write, or None when the node serves no class and no device names it. `stop_bare`: whether
    the operator stops a VMI no VM controls to evacuate it (§6.8), as the binder's evacuator does; `evacuated`:
    the count its status has, kept while the node is cordoned (`evacuated_after` adds to it)."""
    evacuated = evacuated if cluster.capacity.is_cordoned(name) else 0
    node = cluster.capacity.nodes.get(name)
    devices = list(cluster.devices.on(name))
    bound = [d for d in devices if d.holds_gpus]
    matching = matching_classes(cluster, node) if node is not None else []
    if not matching and not devices:
        return None
    clash = conflicts(matching)
    held_units = held(cluster, name)
    listed = {c.spec.resource_name for c in matching} | set(held_units)
    foreign = unmanaged_pods(cluster, name, listed)
    unmanaged: dict[str, int] = defaultdict(int)
    for pod in foreign:
        for r, n in pod.units.items():
            unmanaged[r] += n
    resources = []
    for r in sorted(listed | set(unmanaged)):
        allocatable = node.units(r) if node is not None else 0
        units = held_units.get(r, 0)
        resources.append(
            NodeResource(
                name=r,
                allocatable=allocatable,
                held=units,
                unmanaged=unmanaged[r],
                free=max(0, allocatable - units - unmanaged[r]),
            )
        )

    over = [r for r in resources if r.held > r.allocatable]
    crowded = [r for r in resources if r.held and r.held + r.unmanaged > r.allocatable]
    if node is None and bound:
        lost, reason, message = True, "NodeGone", f"the node is gone with {len(bound)} devices bound to it"
    elif node is not None and not node.ready and bound:
        lost, reason, message = True, "NodeNotReady", f"the node is not Ready with {len(bound)} devices bound to it"
    elif over:
        lost, reason = True, "FewerUnitsThanHeld"
        message = "; ".join(f"{r.name}: {r.held} held, {r.allocatable} allocatable" for r in over)
    elif crowded:
        lost, reason, message = True, "UnmanagedPods", _crowded_message(crowded, foreign)
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
        _evacuation(cluster, name, previous, now, stop_bare=stop_bare, evacuated=evacuated),
    ]
    return GPUNodeStatus(
        resources=resources,
        classes=[c.name for c in matching if c.name not in clash],
        summary=", ".join(f"{r.name} {r.held}/{r.allocatable}" for r in resources),
        unmanaged_pods=foreign[:MAX_UNMANAGED_PODS],
        unmanaged_pod_count=len(foreign) or None,
        evacuated=evacuated or None,
        conditions=conditions,
    )


def evacuated_after(cluster: Cluster, node: str) -> GPUNode | None:
    """The node's GPUNode with one more VM moved off it in its status (§6.8); the condition's words follow on the
    accountant's next look. None when there is no GPUNode to count on, or the node is no longer cordoned (the
    count is of this maintenance only)."""
    existing = cluster.gpunodes.get(node)
    if existing is None or not cluster.capacity.is_cordoned(node):
        return None
    status = existing.status.model_copy(update={"evacuated": (existing.status.evacuated or 0) + 1})
    return existing.model_copy(update={"status": status})
