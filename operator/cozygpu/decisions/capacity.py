"""What a node serves and has free (§8, §5.1), read from the cluster view."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from cozygpu.api import GPUClass, GPUDevice, GPUMode
from cozygpu.decisions.selectors import node_selector_matches, untolerated
from cozygpu.state.cluster import Cluster
from cozygpu.state.nodes import NodeInfo


def matching_classes(cluster: Cluster, node: NodeInfo) -> list[GPUClass]:
    """Classes whose nodeSelector the node's labels satisfy and whose resource it has."""
    return sorted(
        (
            c
            for c in cluster.classes.values()
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


def served_classes(cluster: Cluster, node: NodeInfo) -> list[GPUClass]:
    """The classes the node serves for new placements: matching and not in conflict."""
    matching = matching_classes(cluster, node)
    clash = conflicts(matching)
    return [c for c in matching if c.name not in clash]


def class_of(cluster: Cluster, device: GPUDevice) -> GPUClass | None:
    return cluster.classes.get(device.spec.class_name)


def resource_of(cluster: Cluster, device: GPUDevice) -> str | None:
    cls = class_of(cluster, device)
    return cls.spec.resource_name if cls else None


def held(cluster: Cluster, node: str) -> dict[str, int]:
    """Units held on the node per resource: the counts of its Bound devices (every namespace)."""
    return cluster.held_units(node)


def taken(cluster: Cluster, node: str) -> dict[str, int]:
    """Units not free on the node per resource: held by Bound devices, or by pods the operator did not place
    (§12: a unit a pod behind its back holds is not free either)."""
    return cluster.taken_units(node)


def free(node: NodeInfo, taken_units: dict[str, int], resource: str) -> int:
    """Allocatable minus what is taken, never below zero (`NodeInfo.free`)."""
    return node.free(resource, taken_units.get(resource, 0))


@dataclass(frozen=True)
class NodeVerdict:
    """Whether a node can serve a class at all, before counting units, and why not."""

    ok: bool
    reason: str = ""


def node_serves(cluster: Cluster, node: NodeInfo, cls: GPUClass, served: list[GPUClass] | None = None) -> NodeVerdict:
    """§5.1 except the free-units test: Ready, schedulable, taints tolerated, selector, no conflict."""
    if not node.ready:
        return NodeVerdict(False, f"node {node.name} is not Ready")
    if node.unschedulable:
        return NodeVerdict(False, f"node {node.name} is cordoned")
    blocking = untolerated(cls.spec.tolerations, node.taints)
    if blocking:
        t = blocking[0]
        return NodeVerdict(
            False, f"node {node.name} has taint {t.key}={t.value}:{t.effect} that GPUClass {cls.name} does not tolerate"
        )
    if not node_selector_matches(cls.spec.node_selector, node.labels):
        return NodeVerdict(False, f"node {node.name} does not match the nodeSelector of GPUClass {cls.name}")
    if node.units(cls.spec.resource_name) == 0:
        return NodeVerdict(False, f"node {node.name} has no {cls.spec.resource_name}")
    served = served if served is not None else served_classes(cluster, node)
    if all(c.name != cls.name for c in served):
        return NodeVerdict(False, f"node {node.name} has a class conflict for GPUClass {cls.name}")
    return NodeVerdict(True)
