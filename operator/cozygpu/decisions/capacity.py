"""What a node serves and has free (§8, §5.1), read from the cluster view."""

from __future__ import annotations

from dataclasses import dataclass

from cozygpu.api import GPUClass, GPUDevice
from cozygpu.state import serving
from cozygpu.state.cluster import Cluster
from cozygpu.state.nodes import NodeInfo

conflicts = serving.conflicts  # §8.2, one rule: `state.serving`


def matching_classes(cluster: Cluster, node: NodeInfo) -> list[GPUClass]:
    """Classes whose nodeSelector the node's labels satisfy and whose resource it has."""
    return serving.matching(node, cluster.classes.values())


def served_classes(cluster: Cluster, node: NodeInfo) -> list[GPUClass]:
    """The classes the node serves for new placements: matching and not in conflict (the view's index)."""
    names = cluster.capacity.serving.serves(node.name)
    return sorted((cluster.classes[n] for n in names if n in cluster.classes), key=lambda c: c.name)


def class_of(cluster: Cluster, device: GPUDevice) -> GPUClass | None:
    return cluster.classes.get(device.spec.class_name)


def held(cluster: Cluster, node: str) -> dict[str, int]:
    """Units held on the node per resource: the counts of its Bound devices (every namespace)."""
    return cluster.capacity.held_units(node)


def taken(cluster: Cluster, node: str) -> dict[str, int]:
    """Units not free on the node per resource: held by Bound devices, or by pods the operator did not place
    (§12: a unit a pod behind its back holds is not free either)."""
    return cluster.capacity.taken_units(node)


def free(node: NodeInfo, taken_units: dict[str, int], resource: str) -> int:
    """Allocatable minus what is taken, never below zero (`NodeInfo.free`)."""
    return node.free(resource, taken_units.get(resource, 0))


@dataclass(frozen=True)
class NodeVerdict:
    """Whether a node can serve a class at all, before counting units, and why not."""

    ok: bool
    reason: str = ""


def node_serves(cluster: Cluster, node: NodeInfo, cls: GPUClass) -> NodeVerdict:
    """§5.1 except the free-units test: Ready, schedulable, taints tolerated, selector, no conflict
    (the rule: `state.serving.refusal`)."""
    why = serving.refusal(node, cls, cluster.capacity.serving.serves(node.name))
    return NodeVerdict(why is None, why or "")
