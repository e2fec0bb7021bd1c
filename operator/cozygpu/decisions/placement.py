"""Where a set of devices goes (§5.1-§5.3): one node that can take all of it.

`place` is the binder's decision for a bind request and for a waiting device (a set
of one). It returns a `Placement` or a `NoPlacement` whose message says why, in
words a tenant can act on.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from cozygpu.api import GPUClass, GPUDevice
from cozygpu.decisions.capacity import free, node_serves, served_classes, taken
from cozygpu.state.cluster import Cluster
from cozygpu.state.nodes import NodeInfo

MAX_NODE_REASONS = 4


@dataclass(frozen=True)
class Placement:
    node: str
    moves: tuple[str, ...]  # devices not Bound on `node` before: placed or gathered


@dataclass(frozen=True)
class NoPlacement:
    message: str


def _free_units(n: int) -> str:
    return f"{n} free unit" if n == 1 else f"{n} free units"


def _needs(devices: Sequence[GPUDevice], classes: dict[str, GPUClass], node: str | None) -> dict[str, int]:
    """Units per resource the set still needs on `node` (devices Bound there hold theirs already)."""
    need: dict[str, int] = defaultdict(int)
    for d in devices:
        if node is not None and d.holds_gpus and d.status.node_name == node:
            continue
        need[classes[d.spec.class_name].spec.resource_name] += d.spec.count
    return dict(need)


def _evaluate(
    cluster: Cluster, node: NodeInfo, devices: Sequence[GPUDevice], classes: dict[str, GPUClass]
) -> tuple[tuple[int, int, str], tuple[str, ...]] | str:
    """The node's score (lower is better) and moves, or why it cannot take the set."""
    served = served_classes(cluster, node)
    for cls in {c.name: c for c in classes.values()}.values():
        verdict = node_serves(cluster, node, cls, served)
        if not verdict.ok:
            return verdict.reason
    taken_units = taken(cluster, node.name)
    leftover = 0
    for resource, units in sorted(_needs(devices, classes, node.name).items()):
        available = free(node, taken_units, resource)
        if available < units:
            return f"node {node.name} has {available} free of {resource}, needs {units}"
        leftover += available - units
    moves = tuple(d.name for d in devices if not (d.holds_gpus and d.status.node_name == node.name))
    return (len(moves), leftover, node.name), moves


def _headline(devices: Sequence[GPUDevice], classes: dict[str, GPUClass]) -> str:
    per_class: dict[str, int] = defaultdict(int)
    for d in devices:
        per_class[d.spec.class_name] += d.spec.count
    parts = [
        f"{_free_units(n)} of {classes[c].spec.resource_name} matching GPUClass {c}"
        for c, n in sorted(per_class.items())
    ]
    if len(parts) == 1:
        return f"no node has {parts[0]}"
    return "no node can take the whole set on its own: " + " and ".join(parts)


def _classes(cluster: Cluster, devices: Sequence[GPUDevice]) -> dict[str, GPUClass] | NoPlacement:
    classes: dict[str, GPUClass] = {}
    for d in devices:
        cls = cluster.classes.get(d.spec.class_name)
        if cls is None:
            return NoPlacement(f"GPUDevice {d.name}: GPUClass {d.spec.class_name} does not exist")
        classes[cls.name] = cls
    return classes


def place(cluster: Cluster, devices: Sequence[GPUDevice]) -> Placement | NoPlacement:
    """§5.2-5.3: the node needing the fewest moves, then the fullest after placing, then by name.

    A set of new devices of one resource (every waiting device, most admissions) needs the same
    moves anywhere, so the best node is the first that can take it in the view's best-fit order:
    O(log n) in nodes. Gathers, sets of several resources, and the reasons why nothing fits
    come from looking at every node that has the resources (`place_scanning`)."""
    classes = _classes(cluster, devices)
    if isinstance(classes, NoPlacement):
        return classes
    resources = {c.spec.resource_name for c in classes.values()}
    if len(resources) == 1 and not any(d.holds_gpus for d in devices):
        units = sum(d.spec.count for d in devices)
        for name in cluster.best_fit(next(iter(resources)), units):
            outcome = _evaluate(cluster, cluster.nodes[name], devices, classes)
            if not isinstance(outcome, str):
                return Placement(node=name, moves=outcome[1])
    return place_scanning(cluster, devices)


def place_scanning(cluster: Cluster, devices: Sequence[GPUDevice]) -> Placement | NoPlacement:
    """`place` by looking at every node that has the set's resources; the reference for the fast path."""
    classes = _classes(cluster, devices)
    if isinstance(classes, NoPlacement):
        return classes
    resources = {c.spec.resource_name for c in classes.values()}
    best: tuple[tuple[int, int, str], tuple[str, ...]] | None = None
    reasons: list[str] = []
    for name in cluster.nodes_with(resources):  # a node without the resources is not worth a reason
        node = cluster.nodes[name]
        outcome = _evaluate(cluster, node, devices, classes)
        if isinstance(outcome, str):
            reasons.append(outcome)
        elif best is None or outcome[0] < best[0]:
            best = outcome
    if best is not None:
        return Placement(node=best[0][2], moves=best[1])
    message = _headline(devices, classes)
    if reasons:
        shown = "; ".join(reasons[:MAX_NODE_REASONS])
        more = f"; and {len(reasons) - MAX_NODE_REASONS} more nodes" if len(reasons) > MAX_NODE_REASONS else ""
        message += f" ({shown}{more})"
    else:
        message += " (no node has " + ", ".join(sorted(resources)) + ")"
    return NoPlacement(message)
