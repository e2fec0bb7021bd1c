"""§12.2 for pods: a pod that asks for a managed GPU resource runs only as its VMI's launcher, on its set's node.

Called by the pod webhook (runtime.admission.pod_webhook) with the pod under admission, who
creates it, and its VMI's set as the view has it (`Cluster.vmis.set_of`: by the VMI's uid). kube-scheduler
knows nothing of held devices, and KubeVirt's VM controller rewrites a VMI's affinity
to the VM template's (§3), so the pin that holds is put on the pod itself, which is
immutable once created: whatever KubeVirt renders later (a restart, a migration
target) passes here again.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cozygpu.api import GPUClass, GPUDevice
from cozygpu.api.pods import BadQuantity, asked, owner_vmi
from cozygpu.decisions.admission import ident

__all__ = ["Verdict", "judge", "owner_vmi"]


@dataclass(frozen=True)
class Verdict:
    """Allowed untouched (both None), pinned to `node`, or refused with `refusal`."""

    node: str | None = None
    refusal: str | None = None


def judge(
    pod: Mapping[str, Any],
    user: str,
    controller_user: str,
    devices: Sequence[GPUDevice],
    classes: Mapping[str, GPUClass],
    *,
    exempt: bool = False,
    previous: Sequence[str] = (),
) -> Verdict:
    """§12.2: who may create the pod, for which VMI, how many units, on which node. In a namespace exempt from
    §12 (`exempt`) a pod with no set of the operator's behind it passes untouched; one with a set is pinned.
    `previous`: launcher pods of an earlier VMI of the name that still hold units (§6.7)."""
    meta = pod.get("metadata") or {}
    what = f"Pod {meta.get('namespace', '')}/{meta.get('name') or meta.get('generateName', '')}"
    managed = {c.spec.resource_name for c in classes.values()}
    try:
        wants = asked(pod, managed)
    except BadQuantity as e:
        return Verdict(refusal=f"{what}: a managed GPU resource: {e}")
    if not wants:
        return Verdict()
    owner = owner_vmi(pod)
    if exempt and (owner is None or not devices):
        return Verdict()
    resources = ", ".join(sorted(wants))
    if user != controller_user:
        return Verdict(
            refusal=f"{what} asks for {resources}, which the GPU operator manages: only KubeVirt's controller "
            f"({controller_user}) may create such pods, for VMs that reference GPUDevices"
        )
    if owner is None:
        return Verdict(refusal=f"{what} asks for {resources} but is not controlled by a VirtualMachineInstance")
    vmi = owner[0]
    if not devices:
        return Verdict(
            refusal=f"{what} asks for {resources} for VMI {vmi}, which has no GPUDevices attached by the GPU operator"
        )
    not_held = [d for d in devices if not d.holds_gpus]
    if not_held:
        return Verdict(refusal=f"{what}: the GPUs of VMI {vmi} are not held: " + "; ".join(map(ident, not_held)))
    nodes = sorted({d.status.node_name or "" for d in devices})
    if len(nodes) != 1:
        return Verdict(refusal=f"{what}: the GPUDevices of VMI {vmi} are on more than one node: {', '.join(nodes)}")
    held: dict[str, int] = defaultdict(int)
    for d in devices:
        cls = classes.get(d.spec.class_name)
        if cls is not None:
            held[cls.spec.resource_name] += d.spec.count
    over = [f"{n} of {r} (its devices hold {held.get(r, 0)})" for r, n in sorted(wants.items()) if n > held.get(r, 0)]
    if over:
        return Verdict(refusal=f"{what} asks for more GPUs than VMI {vmi} holds: " + ", ".join(over))
    if previous:
        # §6.7: a new VMI of the name took the set over; its guest starts only once the old one has let go, or the
        # set's units would serve two guests and the second would take units that are someone else's.
        return Verdict(
            refusal=f"{what}: the previous guest of VMI {vmi} still holds its GPUs in pod "
            f"{', '.join(previous)}; KubeVirt retries the start once it has ended"
        )
    node = nodes[0]
    assigned = (pod.get("spec") or {}).get("nodeName")
    if assigned and assigned != node:
        return Verdict(refusal=f"{what} is assigned to node {assigned}, and the GPUs of VMI {vmi} are on {node}")
    return Verdict(node=node)
