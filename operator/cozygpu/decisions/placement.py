"""Where a set of devices goes (§5.1-§5.3): one node that can take all of it.

`place` is the binder's decision for a bind request and for a waiting device (a set
of one). It returns a `Placement` or a `NoPlacement` whose message says why, in
words a tenant can act on, and whose detail says why the closest nodes fall short:
GPUNode data tenants cannot read, for the platform's log alone (issue 34 item 6).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from cozygpu.api import GPUClass, GPUDevice
from cozygpu.decisions.capacity import free, node_serves, taken
from cozygpu.state.cluster import Cluster
from cozygpu.state.nodes import NodeInfo

MAX_NODE_REASONS = 4


@dataclass(frozen=True)
class Placement:
    node: str
    moves: tuple[str, ...]  # devices not Bound on `node` before: placed or gathered


@dataclass(frozen=True)
class NoPlacement:
    message: str  # for the tenant: device status, Events, the VMI's refusal
    full: bool = False  # no node had the units free: idle moves may make room (§5.7)
    detail: str = ""  # for the platform's log: the closest nodes and their free units


def _free_units(n: int) -> str:
    return f"{n} free unit" if n == 1 else f"{n} free units"


def needs(devices: Sequence[GPUDevice], classes: dict[str, GPUClass], node: str | None) -> dict[str, int]:
    """Units per resource the set still needs on `node` (devices Bound there hold theirs already)."""
    need: dict[str, int] = defaultdict(int)
    for d in devices:
        if node is not None and d.holds_gpus and d.status.node_name == node:
            continue
        need[classes[d.spec.class_name].spec.resource_name] += d.spec.count
    return dict(need)


@dataclass(frozen=True)
class _Miss:
    """Why a node cannot take the set; `free` when it serves every class but has too few units."""

    reason: str
    free: int | None = None

    @property
    def order(self) -> tuple[int, int]:
        """The closest misses first: the most free units, then those that do not serve the classes."""
        return (0, -self.free) if self.free is not None else (1, 0)


def _evaluate(
    cluster: Cluster, node: NodeInfo, devices: Sequence[GPUDevice], classes: dict[str, GPUClass]
) -> tuple[tuple[int, int, str], tuple[str, ...]] | _Miss:
    """The node's score (lower is better) and moves, or why it cannot take the set."""
    for cls in classes.values():
        verdict = node_serves(cluster, node, cls)
        if not verdict.ok:
            return _Miss(verdict.reason)
    taken_units = taken(cluster, node.name)
    leftover = 0
    for resource, units in sorted(needs(devices, classes, node.name).items()):
        available = free(node, taken_units, resource)
        if available < units:
            return _Miss(f"node {node.name} has {available} free of {resource}, needs {units}", available)
        leftover += available - units
    moves = tuple(d.name for d in devices if not (d.holds_gpus and d.status.node_name == node.name))
    return (len(moves), leftover, node.name), moves


def _unplaced(headline: str, shown: list[str], total: int, resources: set[str]) -> NoPlacement:
    """The headline for the tenant; the closest nodes' reasons and how many more fell short for the log."""
    if not total:
        return NoPlacement(headline + " (no node has " + ", ".join(sorted(resources)) + ")", True)
    more = f"; and {total - len(shown)} more nodes" if total > len(shown) else ""
    return NoPlacement(headline, True, "; ".join(shown) + more)


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


def not_ready(cluster: Cluster, devices: Sequence[GPUDevice]) -> NoPlacement | None:
    """§12.3, while the no-bypass policy is in force: a device that would take new units waits while its class is
    not ready (`GPUClass.ready`), moments after the class is created. Devices holding units already (a VM start, a
    move) do not."""
    for d in devices:
        cls = cluster.classes.get(d.spec.class_name)
        if cls is not None and not d.holds_gpus and not cls.ready():
            return NoPlacement(
                f"GPUClass {cls.name} is not ready yet: its devices take units once the API server is seen "
                f"refusing plain pods that ask for {cls.spec.resource_name}, moments after the class is created"
            )
    return None


def classes_of(
    cluster: Cluster, devices: Sequence[GPUDevice], *, guarded: bool = False
) -> dict[str, GPUClass] | NoPlacement:
    """The set's classes, or why it cannot be placed now: a class missing, or with `guarded`, `not_ready`."""
    classes: dict[str, GPUClass] = {}
    for d in devices:
        cls = cluster.classes.get(d.spec.class_name)
        if cls is None:
            return NoPlacement(f"GPUDevice {d.name}: GPUClass {d.spec.class_name} does not exist")
        classes[cls.name] = cls
    return (not_ready(cluster, devices) if guarded else None) or classes


def place(cluster: Cluster, devices: Sequence[GPUDevice], *, guarded: bool = False) -> Placement | NoPlacement:
    """§5.2-5.3: the node needing the fewest moves, then the fullest after placing, then by name.

    A set of new devices of one resource (every waiting device, most admissions) needs the same moves
    anywhere, so the best node is the first in the best-fit order that serves every class of the set:
    O(log n) in nodes for one class (§14.3), and for one class that none fits is known from the same
    order, its reason naming the closest nodes from the view's indexes. A set with Bound members (a VM
    start with a held device) needs fewer moves only where its members are: those few nodes are judged
    one by one, and past them the order is the same (`_gather`). What the indexes cannot order looks
    at every node that has the resources (`place_scanning`): sets of several resources, and the
    reasons why a set of several classes fits nowhere. `guarded`: as `classes_of`."""
    classes = classes_of(cluster, devices, guarded=guarded)
    if isinstance(classes, NoPlacement):
        return classes
    if len({c.spec.resource_name for c in classes.values()}) != 1:
        return place_scanning(cluster, devices)
    if any(d.holds_gpus for d in devices):
        return _gather(cluster, devices, classes)
    units = sum(d.spec.count for d in devices)
    node = _first_fit(cluster, classes, units)
    if node is not None:
        return Placement(node, tuple(d.name for d in devices))
    return _nowhere(cluster, units, devices, classes)


def _first_fit(cluster: Cluster, classes: dict[str, GPUClass], units: int, skip: Sequence[str] = ()) -> str | None:
    """The fullest node with `units` free of the classes' one resource that serves every class, but those in
    `skip`. Every class shares the resource, so each class's order is by the same free units: walk the shortest."""
    wanted = set(classes)
    fewest = min(wanted, key=lambda c: cluster.capacity.serving.counts(c)[0])
    fits = cluster.capacity.serving.best_fit(fewest, units)
    return next((n for n in fits if n not in skip and wanted <= cluster.capacity.serving.serves(n)), None)


def _nowhere(
    cluster: Cluster,
    units: int,
    devices: Sequence[GPUDevice],
    classes: dict[str, GPUClass],
    homes: Sequence[str] = (),
) -> Placement | NoPlacement:
    """Why no node takes the set: from the indexes for one class; for several, the scan says (and decides)."""
    if len(classes) == 1:
        (cls,) = classes.values()
        return _unfit(cluster, cls, units, devices, classes, homes=homes)
    return place_scanning(cluster, devices)


def _gather(cluster: Cluster, devices: Sequence[GPUDevice], classes: dict[str, GPUClass]) -> Placement | NoPlacement:
    """`place` for a set of one resource with Bound members, as the scan decides it without looking at every node
    (issue 34 item 5): a node holding a member moves fewer devices than any other, so the best of those few
    that take the rest wins; else the fullest node that takes the whole set, the first of the best-fit order."""
    homes = sorted({n for d in devices if d.holds_gpus and (n := d.status.node_name) and n in cluster.capacity.nodes})
    best: tuple[tuple[int, int, str], tuple[str, ...]] | None = None
    for name in homes:
        outcome = _evaluate(cluster, cluster.capacity.nodes[name], devices, classes)
        if not isinstance(outcome, _Miss) and (best is None or outcome[0] < best[0]):
            best = outcome
    if best is not None:
        return Placement(node=best[0][2], moves=best[1])
    units = sum(d.spec.count for d in devices)
    node = _first_fit(cluster, classes, units, skip=homes)
    if node is not None:
        return Placement(node, tuple(d.name for d in devices))
    return _nowhere(cluster, units, devices, classes, homes)


def _unfit(
    cluster: Cluster,
    cls: GPUClass,
    units: int,
    devices: Sequence[GPUDevice],
    classes: dict[str, GPUClass],
    *,
    homes: Sequence[str] = (),
) -> NoPlacement:
    """Why no node takes `units` of one class, from the indexes: the serving nodes with the most free
    units, then the nodes with the resource that do not serve the class, by name (as `place_scanning`);
    a node in `homes` holds members of the set, and needs less (judged as the scan judges it)."""
    index, resource = cluster.capacity.serving, cls.spec.resource_name
    shown = []
    for free_units, name in index.fullest_first(cls.name, MAX_NODE_REASONS):
        outcome = _evaluate(cluster, cluster.capacity.nodes[name], devices, classes) if name in homes else None
        if isinstance(outcome, _Miss):
            shown.append(outcome.reason)
        else:
            shown.append(f"node {name} has {free_units} free of {resource}, needs {units}")
    for name in index.unserved(cls.name, MAX_NODE_REASONS - len(shown)):
        shown.append(node_serves(cluster, cluster.capacity.nodes[name], cls).reason)
    return _unplaced(_headline(devices, classes), shown, sum(index.counts(cls.name)), {resource})


def place_scanning(cluster: Cluster, devices: Sequence[GPUDevice]) -> Placement | NoPlacement:
    """`place` by looking at every node that has the set's resources; the reference for the fast path."""
    classes = classes_of(cluster, devices)
    if isinstance(classes, NoPlacement):
        return classes
    resources = {c.spec.resource_name for c in classes.values()}
    best: tuple[tuple[int, int, str], tuple[str, ...]] | None = None
    misses: list[tuple[tuple[int, int], str, str]] = []
    for name in cluster.capacity.nodes_with(resources):  # a node without the resources is not worth a reason
        node = cluster.capacity.nodes[name]
        outcome = _evaluate(cluster, node, devices, classes)
        if isinstance(outcome, _Miss):
            misses.append((outcome.order, name, outcome.reason))
        elif best is None or outcome[0] < best[0]:
            best = outcome
    if best is not None:
        return Placement(node=best[0][2], moves=best[1])
    shown = [reason for _, _, reason in sorted(misses)[:MAX_NODE_REASONS]]
    return _unplaced(_headline(devices, classes), shown, len(misses), resources)
