"""Units that pods hold on a node beyond what the operator's Bound devices there account for (§1.3, §12).

Callers: `state.indexers` recounts a node here whenever its pods or the sets Bound on it change,
and the result counts as taken in `state.capacity` (not free for placement); the node accountant
reads `on(node)` through the cluster (`Cluster.pods.unmanaged_on`) for the GPUNode status.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from cozygpu.api import GPUClass, GPUDevice
from cozygpu.state.capacity import Capacity
from cozygpu.state.pods import PodUsage, PodUse
from cozygpu.state.store import writes

SetOf = Callable[[str, str, str], list[GPUDevice]]  # (namespace, vmi, uid) -> the VMI object's set


class Unmanaged:
    def __init__(self, pods: PodUsage, capacity: Capacity, classes: Mapping[str, GPUClass], set_of: SetOf) -> None:
        self._pods, self._capacity, self._classes, self._set_of = pods, capacity, classes, set_of

    def _set_on_node(self, pod: PodUse) -> dict[str, int]:
        """Units per resource the devices of the pod's VMI (by its uid, §6.7) hold Bound on the pod's node."""
        out: dict[str, int] = {}
        for d in self._set_of(pod.namespace, pod.vmi, pod.vmi_uid or "") if pod.vmi else ():
            cls = self._classes.get(d.spec.class_name)
            if cls is not None and d.holds_gpus and d.status.node_name == pod.node:
                out[cls.spec.resource_name] = out.get(cls.spec.resource_name, 0) + d.spec.count
        return out

    def on(self, node: str) -> list[tuple[PodUse, dict[str, int]]]:
        """The pods on the node holding units no device the operator Bound there accounts for, each with those
        units. A launcher is the operator's up to what its VMI's set holds on this very node (§12.2 caps it
        there); each launcher is measured on its own, so a restart's old launcher, still terminating beside
        the new one, is not counted twice. Every other pod's units are unmanaged."""
        out = []
        for pod in self._pods.on(node):
            own = self._set_on_node(pod)
            extra = {r: n - own.get(r, 0) for r, n in sorted(pod.units.items()) if n > own.get(r, 0)}
            if extra:
                out.append((pod, extra))
        return out

    @writes
    def recount(self, node: str) -> None:
        """Keep the node's unmanaged units current; room that appears is news for waiting devices (§5.5)."""
        if not self._capacity.has_unmanaged(node) and not self._pods.holds_on(node):
            return
        now: dict[str, int] = {}
        for _, extra in self.on(node):
            for resource, units in extra.items():
                now[resource] = now.get(resource, 0) + units
        self._capacity.set_unmanaged(node, now)

    @writes
    def recount_everywhere(self) -> None:
        """A class changed: which resource a set holds may have too (few nodes: those with such pods)."""
        for node in set(self._pods.nodes()) | set(self._capacity.unmanaged_nodes()):
            self.recount(node)
