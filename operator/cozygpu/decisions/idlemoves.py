"""Idle moves (§5.7): which idle held devices to move, and where, so that a set no node can take fits on one.

Called by the binder's mover (runtime.workers.binder.mover) when `placement.place` found no node with the units
free (`NoPlacement.full`). Pure: it reads the view and returns a `RoomPlan`, or None when no plan of at
most `limit` moves exists among the nodes it looks at. The same mover asks `leaving` which idle devices leave
cordoned nodes, and where to (§6.8: a node taken out of service leaves no device Lost).

Only idle devices move (`GPUDevice.idle`: Bound, attached to no VMI, in no open request; never a template
device), of classes that allow it (`GPUClass.spec.idleMoves`), idle for `idle_after` seconds at least (a
VM restarting or being started detaches and attaches its held devices within moments; and a device moved
is idle anew, so no tenant can make another's device move again and again), named by no open request
(a set its webhook is still writing), never one of the set itself nor one whose write is in flight.
Bounded per decision (§14.3): the nodes looked at are those of the set's own Bound members and the first
`LOOK_AT` in the view's reach order (free plus idle units, the fewest that could do first), each plan
reads the few devices on its node, and each move's destination comes from the moved class's best-fit order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cozygpu.api import GPUClass, GPUDevice, IdleMoves
from cozygpu.decisions.capacity import free, node_serves
from cozygpu.decisions.placement import NoPlacement, classes_of, needs
from cozygpu.state.cluster import Cluster, DeviceKey
from cozygpu.state.nodes import NodeInfo

LOOK_AT = 16  # nodes looked at per decision, whether they serve the set or not


@dataclass(frozen=True)
class Move:
    device: GPUDevice
    to: str

    @property
    def origin(self) -> str:
        return self.device.status.node_name or ""


@dataclass(frozen=True)
class RoomPlan:
    """Make `moves`, then the set fits on `node`."""

    node: str
    moves: tuple[Move, ...]


def movable(cluster: Cluster, device: GPUDevice, idle_after: float = 0.0) -> bool:
    """Whether §5.7 may move the device for someone else: idle for `idle_after` seconds, its class allows it, no
    open request names it and no write of ours is on it."""
    cls = cluster.classes.get(device.spec.class_name)
    if cls is None or cls.spec.idle_moves is IdleMoves.NEVER or not device.idle:
        return False
    key = device.key
    idle_for = cluster.capacity.idle_for(key)
    if idle_for is None or idle_for < idle_after or cluster.devices.named_by_open_request(*key):
        return False
    return not cluster.devices.assumed(*key)


def leaving(cluster: Cluster, idle_after: float, room: Callable[[str], int], most: int) -> list[Move]:
    """§6.8: idle held devices on cordoned nodes that may move (`movable`), each to the fullest node of its class that
    takes it: at most `room(node)` off each node and `most` in all, the cordoned nodes by name, on each the largest
    devices first. A device no node takes stays, and is looked at again when room for its class appears. O(the
    devices on cordoned nodes), not the cluster."""
    into: dict[tuple[str, str], int] = {}
    moves: list[Move] = []
    for name in sorted(cluster.capacity.cordoned()):
        if len(moves) >= most:
            break
        left = room(name)
        idle = [d for d in cluster.devices.on(name) if d.status.node_name == name and movable(cluster, d, idle_after)]
        for d in sorted(idle, key=lambda d: (-d.spec.count, *d.key)):
            if left <= 0 or len(moves) >= most:
                break
            resource = cluster.classes[d.spec.class_name].spec.resource_name
            to = _destination(cluster, d, resource, name, into)
            if to is None:
                continue
            moves.append(Move(d, to))
            into[(to, resource)] = into.get((to, resource), 0) + d.spec.count
            left -= 1
    return moves


def plan_room(cluster: Cluster, devices: Sequence[GPUDevice], limit: int, idle_after: float = 0.0) -> RoomPlan | None:
    """The fewest moves (at most `limit`) of devices idle `idle_after` seconds at least, after which one node takes
    the whole set: among the nodes looked at, the plan with the fewest moves, then the fewest units left free on
    its node (bin-packing, §5.3), then by name, so decisions are reproducible."""
    classes = classes_of(cluster, devices)
    if limit <= 0 or isinstance(classes, NoPlacement):
        return None
    total = needs(devices, classes, None)
    if not total:
        return None
    lead = max(sorted(total), key=lambda r: total[r])  # the resource the set needs most leads the search
    mine = {d.key for d in devices}
    best: tuple[tuple[int, int, str], RoomPlan] | None = None
    for name in _candidates(cluster, devices, lead, total[lead]):
        node = cluster.capacity.nodes.get(name)
        if node is None or not all(node_serves(cluster, node, c).ok for c in classes.values()):
            continue
        plan = _plan_on(cluster, node, devices, classes, mine, limit=limit, idle_after=idle_after)
        if plan is not None and (best is None or plan[0] < best[0]):
            best = plan
    return best[1] if best is not None else None


def _candidates(cluster: Cluster, devices: Sequence[GPUDevice], lead: str, units: int) -> list[str]:
    """The nodes where the set's own Bound members are (it needs less there), then the first `LOOK_AT` by reach."""
    out = sorted({d.status.node_name for d in devices if d.holds_gpus and d.status.node_name})
    for looked, name in enumerate(cluster.capacity.reach_fit(lead, units)):
        if looked >= LOOK_AT:
            break
        if name not in out:
            out.append(name)
    return out


def _plan_on(
    cluster: Cluster,
    node: NodeInfo,
    devices: Sequence[GPUDevice],
    classes: dict[str, GPUClass],
    mine: set[DeviceKey],
    *,
    limit: int,
    idle_after: float,
) -> tuple[tuple[int, int, str], RoomPlan] | None:
    """Moves off `node` that leave the set room there: the largest idle devices first (the fewest moves to
    cover what is short), each to the fullest other node of its class that still takes it."""
    taken = cluster.capacity.taken_units(node.name)
    short: dict[str, int] = {}
    left = 0
    for resource, units in needs(devices, classes, node.name).items():
        available = free(node, taken, resource)
        short[resource] = units - available
        left += max(available - units, 0)
    if all(v <= 0 for v in short.values()):
        return None  # it fits as it is: not idle moves' to decide
    idle = [
        d
        for d in cluster.devices.on(node.name)
        if d.status.node_name == node.name and d.key not in mine and movable(cluster, d, idle_after)
    ]
    idle.sort(key=lambda d: (-d.spec.count, *d.key))
    into: dict[tuple[str, str], int] = {}  # (node, resource) -> units this plan moves there
    moves: list[Move] = []
    for d in idle:
        resource = cluster.classes[d.spec.class_name].spec.resource_name
        if short.get(resource, 0) <= 0:
            continue
        to = _destination(cluster, d, resource, node.name, into)
        if to is None:
            continue
        moves.append(Move(d, to))
        if len(moves) > limit:
            return None
        into[(to, resource)] = into.get((to, resource), 0) + d.spec.count
        short[resource] -= d.spec.count
        if all(v <= 0 for v in short.values()):
            left += sum(-v for v in short.values())
            return (len(moves), left, node.name), RoomPlan(node.name, tuple(moves))
    return None


def _destination(
    cluster: Cluster, device: GPUDevice, resource: str, origin: str, into: dict[tuple[str, str], int]
) -> str | None:
    """The fullest node serving the device's class, other than `origin`, with its units free once this plan's
    earlier moves there count. Skips only the origin and this plan's destinations: O(moves) past the first."""
    for name in cluster.capacity.serving.best_fit(device.spec.class_name, device.spec.count):
        if name == origin:
            continue
        coming = into.get((name, resource), 0)
        if not coming:
            return name
        node = cluster.capacity.nodes.get(name)
        if node is not None and free(node, cluster.capacity.taken_units(name), resource) - coming >= device.spec.count:
            return name
    return None
