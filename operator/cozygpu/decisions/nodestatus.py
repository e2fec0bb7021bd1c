"""GPUNode status (§1.3, §8): what a node serves, holds and has lost, from the cluster view.

Besides the units of Bound devices, the status shows the units that pods the operator
did not place hold on the node (§12), from the view's pod index (`Cluster.pods`):
- A pod is the operator's when it is the launcher of a VMI (same namespace, the name
  its controller ownerReference gives) whose attached devices are Bound on this very
  node; it is measured against what those devices hold there, per resource, and units
  it asks beyond that count as unmanaged (§12.2 caps a launcher at its set). Each
  launcher pod is measured on its own: a restart's old launcher, still terminating
  beside the new one, is not counted twice.
- Every other pod asking for a managed resource (the `resourceName` of any GPUClass)
  or one the node's status lists is unmanaged: launchers of VMIs the operator did not
  admit or whose set is elsewhere, pods created before the no-bypass policy, pods in an
  exempt namespace. Other extended resources are not the operator's business.
- Units that such pods take from what Bound devices hold (held + unmanaged above
  allocatable) are lost capacity (§1.3, §5.6): the devices are Bound to units a
  foreign pod is using, and their VMs cannot start there until it ends.
`free` stays allocatable - held, what the binder counts (`Cluster.held_units`).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict

from cozygpu.api import Condition, ConditionStatus, GPUNodeStatus, NodeResource, UnmanagedPod
from cozygpu.api.gpunode import MAX_UNMANAGED_PODS
from cozygpu.api.names import CONDITION_CLASS_CONFLICT, CONDITION_LOST_CAPACITY
from cozygpu.decisions.capacity import conflicts, held, matching_classes
from cozygpu.state.cluster import Cluster
from cozygpu.state.pods import PodUse

# Pods a LostCapacity message names, per crowded resource.
MAX_NAMED_PODS = 3


def _condition(
    type_: str, true: bool, *, reason: str, message: str, previous: list[Condition], now: dt.datetime
) -> Condition:
    status = ConditionStatus.TRUE if true else ConditionStatus.FALSE
    before = next((c for c in previous if c.type == type_), None)
    since = before.last_transition_time if before is not None and before.status == status else now
    return Condition(type=type_, status=status, reason=reason, message=message, last_transition_time=since)


def _set_on_node(cluster: Cluster, pod: PodUse) -> dict[str, int]:
    """Units per resource that the devices attached to the pod's VMI hold on the pod's node."""
    if pod.vmi is None:
        return {}
    out: dict[str, int] = defaultdict(int)
    for d in cluster.attached_to(pod.namespace, pod.vmi):
        cls = cluster.classes.get(d.spec.class_name)
        if cls is not None and d.holds_gpus and d.status.node_name == pod.node:
            out[cls.spec.resource_name] += d.spec.count
    return out


def unmanaged_pods(cluster: Cluster, name: str, listed: set[str]) -> list[UnmanagedPod]:
    """The pods on the node holding units of managed or `listed` resources that no device the operator
    placed there accounts for, each with those units, by namespace and name."""
    watched = listed | {c.spec.resource_name for c in cluster.classes.values()}
    out = []
    for pod in cluster.pods.on(name):
        own = _set_on_node(cluster, pod)
        extra = {r: n - own.get(r, 0) for r, n in sorted(pod.units.items()) if r in watched and n > own.get(r, 0)}
        if extra:
            out.append(UnmanagedPod(pod=pod.ident, vmi=pod.vmi, units=extra))
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
                name=r, allocatable=allocatable, held=units, unmanaged=unmanaged[r], free=max(0, allocatable - units)
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
    ]
    return GPUNodeStatus(
        resources=resources,
        classes=[c.name for c in matching if c.name not in clash],
        summary=", ".join(f"{r.name} {r.held}/{r.allocatable}" for r in resources),
        unmanaged_pods=foreign[:MAX_UNMANAGED_PODS],
        unmanaged_pod_count=len(foreign) or None,
        conditions=conditions,
    )
