"""Node maintenance (§6.8): what to do for a VMI KubeVirt marked for evacuation, decided on the view alone.

Callers: the binder's evacuator (runtime.workers.binder.evacuator) on the leader, serialised with every other
placement, and the accountant, which shows a node's evacuation on its GPUNode (`of_node`). For a VMI whose
eviction strategy is `External` (its own, else the cluster's from the KubeVirt CR) and whose set the operator
placed, the steps are, each derived from the view so that a new leader picks up where the last one stopped:

1. `Reserve`: the set is moved, in the view and then in the API, to one node that takes all of it (§5.1-5.3),
   while the VM still runs: the destination's units are held by the set's own Bound devices, so no other
   order, held create, template bind or idle move can take them, and they survive any restart of the operator.
   The launcher's units on the old node stay taken as long as it runs (the units pods hold, §12).
2. `Restart`: no member of the set is on the marked node any more: the VMI is deleted, KubeVirt's VM
   controller makes the next one, and its admission gathers the set where it already is.

A VMI no VM controls is stopped (`Stop`) only when the platform says so; otherwise, and when no node can take
the set, the evacuation is `Blocked`, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from cozygpu.api import GPUDevice
from cozygpu.api.kubevirt import EXTERNAL
from cozygpu.api.names import CONDITION_PLACED, REASON_EVACUATING
from cozygpu.decisions.placement import NoPlacement, place
from cozygpu.state.cluster import Cluster
from cozygpu.state.vmis import Mark


@dataclass(frozen=True)
class Evacuation:
    """A VMI marked for evacuation off `node`, with the set of its that the operator placed."""

    namespace: str
    vmi: str
    uid: str
    node: str
    devices: tuple[GPUDevice, ...]
    vm: str | None  # the VirtualMachine that starts it again, if one controls it

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.vmi)


@dataclass(frozen=True)
class Reserve:
    """Move `devices` (those of the set not there yet) to `node`, reserving its units for the restart."""

    node: str
    devices: tuple[GPUDevice, ...]


@dataclass(frozen=True)
class Restart:
    """The set waits on `node`: delete the VMI, and its VM starts the next one."""

    node: str


@dataclass(frozen=True)
class Stop:
    """A VMI no VM controls, stopped because the platform said so (its held devices become idle)."""


@dataclass(frozen=True)
class Blocked:
    """The VM keeps running on the marked node, and the drain waits; `reason` says why."""

    reason: str


Step = Reserve | Restart | Stop | Blocked


def strategy(cluster: Cluster, mark: Mark) -> str | None:
    """The VMI's eviction strategy as KubeVirt reads it: its own, else the cluster's (the KubeVirt CR's)."""
    if mark.strategy is not None:
        return mark.strategy
    return next((kv.eviction_strategy for kv in cluster.kubevirts.values() if kv.eviction_strategy), None)


def reserved(device: GPUDevice) -> bool:
    """Whether the device holds its units where its VM restarts off a node being drained (`transitions.reserved`)."""
    placed = next((c for c in device.status.conditions if c.type == CONDITION_PLACED), None)
    return placed is not None and placed.reason == REASON_EVACUATING


def marked(cluster: Cluster, node: str | None = None) -> list[Evacuation]:
    """The VMIs to evacuate (off `node`, or every node), the first marked first: marked off a cordoned node,
    `External`, and holding a set the operator placed there or reserved off it. A VMI with another strategy is
    KubeVirt's. Only KubeVirt's service accounts get a VMI's status written (virt-api's mutator drops anyone
    else's), and should that webhook be missing a mark still counts only where the platform is draining: a cordoned
    node its set is on, or was reserved off."""
    out = []
    for (namespace, name), mark in cluster.vmis.marked(node):
        uid = cluster.vmis.get((namespace, name))
        if uid is None or not cluster.capacity.is_cordoned(mark.node):
            continue
        if strategy(cluster, mark) != EXTERNAL:
            continue
        devices = tuple(d for d in cluster.vmis.set_of(namespace, name, uid) if d.holds_gpus)
        if not devices or not all(d.status.node_name == mark.node or reserved(d) for d in devices):
            continue
        vm = cluster.vmis.vm_of(namespace, name)
        out.append(Evacuation(namespace, name, uid, mark.node, devices, vm[0] if vm is not None else None))
    return out


def decide(cluster: Cluster, evacuation: Evacuation, *, stop_bare: bool) -> Step:
    """The next step of one evacuation (see the module's docstring)."""
    if evacuation.vm is None:
        if stop_bare:
            return Stop()
        return Blocked(
            f"VMI {evacuation.vmi} has no VirtualMachine to start it again elsewhere; it is stopped only when the "
            "operator's stopBareVMIs setting says so"
        )
    on = {d.status.node_name for d in evacuation.devices}
    if evacuation.node not in on and len(on) == 1:
        return Restart(on.pop() or "")
    outcome = place(cluster, evacuation.devices)
    if isinstance(outcome, NoPlacement):
        return Blocked(outcome.message)
    moving = tuple(d for d in evacuation.devices if d.status.node_name != outcome.node)
    return Reserve(outcome.node, moving)


@dataclass(frozen=True)
class NodeEvacuation:
    """A node's evacuation, for its GPUNode (§8): the VMs still to move, those waiting for their restart on the
    node reserved for them, and those blocked, with why (names as namespace/vmi: GPUNodes are the platform's)."""

    waiting: tuple[str, ...]
    restarting: tuple[str, ...]
    blocked: tuple[tuple[str, str], ...]


def of_node(cluster: Cluster, node: str, *, stop_bare: bool) -> NodeEvacuation | None:
    """What the node's GPUNode says of its evacuation; None when no VMI is marked off it."""
    evacuations = marked(cluster, node)
    if not evacuations:
        return None
    waiting, restarting, blocked = [], [], []
    for evacuation in evacuations:
        name = f"{evacuation.namespace}/{evacuation.vmi}"
        step = decide(cluster, evacuation, stop_bare=stop_bare)
        if isinstance(step, Blocked):
            blocked.append((name, step.reason))
        elif isinstance(step, Restart):
            restarting.append(name)
        else:
            waiting.append(name)
    return NodeEvacuation(tuple(waiting), tuple(restarting), tuple(blocked))
