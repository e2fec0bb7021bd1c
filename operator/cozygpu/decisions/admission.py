"""The VMI admission rules of §3 as pure functions over fresh devices and the view.

The webhook executor (runtime.admission.vmi_webhook) reads the referenced devices fresh from
the API and passes them in; everything else (classes, nodes, GPUNodes, budgets, the
KubeVirt permitted table) comes from the cluster view. Every refusal is a message a
tenant can act on, naming the object at fault.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cozygpu.api import ConditionStatus, GPUClass, GPUDevice, GPUMode, Phase
from cozygpu.api.gpudevice import GPUDeviceSpec
from cozygpu.api.kubevirt import owned_by
from cozygpu.api.meta import ObjectMeta
from cozygpu.api.names import (
    ANNOTATION_ADMITTED,
    API_VERSION,
    CONDITION_LOST_CAPACITY,
    FINALIZER_IN_USE,
    KUBEVIRT_API_VERSION,
    LABEL_MODE,
    LABEL_TEMPLATE_DEVICE,
    TRUE,
    is_object_name,
    template_device_name,
)
from cozygpu.api.references import HeldRef, TemplateRef
from cozygpu.decisions.capacity import conflicts, held, matching_classes
from cozygpu.decisions.orders import Order
from cozygpu.state.cluster import Cluster
from cozygpu.state.nodes import node_selector_matches


@dataclass(frozen=True)
class Member:
    """One device of the VMI's set, with its class and its entry index."""

    device: GPUDevice
    cls: GPUClass
    index: int
    template: bool = False
    create: bool = False  # a template device that does not exist yet


def ident(device: GPUDevice) -> str:
    if device.status.phase in (Phase.BOUND, Phase.LOST) and device.status.node_name:
        return f"GPUDevice {device.name} (node {device.status.node_name})"
    return f"GPUDevice {device.name}"


def _phase_words(device: GPUDevice) -> str:
    match device.status.phase:
        case None:
            return "not admitted yet and holds no GPUs"
        case Phase.PENDING:
            return "Pending and holds no GPUs yet"
        case Phase.LOST:
            return "Lost and holds no GPUs"
        case _:
            return str(device.status.phase)


def _node_problem(cluster: Cluster, device: GPUDevice, cls: GPUClass) -> str | None:
    """§3.3: gone, no longer serving the class, or lost capacity the device does not fit under."""
    node_name = device.status.node_name or ""
    node = cluster.capacity.nodes.get(node_name)
    if node is None:
        return f"GPUDevice {device.name}: node {node_name} is gone"
    if not node_selector_matches(cls.spec.node_selector, node.labels) or cls.name in conflicts(
        matching_classes(cluster, node)
    ):
        return f"GPUDevice {device.name}: node {node_name} no longer serves GPUClass {cls.name}"
    gpunode = cluster.gpunodes.get(node_name)
    lost = gpunode is not None and any(
        c.type == CONDITION_LOST_CAPACITY and c.status is ConditionStatus.TRUE for c in gpunode.status.conditions
    )
    if not lost:
        return None
    resource = cls.spec.resource_name
    if not node.ready or held(cluster, node_name).get(resource, 0) > node.units(resource):
        return f"GPUDevice {device.name}: node {node_name} has lost capacity"
    return None


def unavailable(device: GPUDevice, vmi: str) -> str | None:
    """§3.3, §4: being deleted, or attached to another VMI; checked on the fresh read and again at the write."""
    attached = device.status.attached_to
    if device.deleting:
        return f"{ident(device)} is being deleted"
    if attached is not None and attached.vmi != vmi:
        return f"{ident(device)} is attached to VMI {attached.vmi}"
    return None


def check_held(cluster: Cluster, vmi: str, index: int, ref: HeldRef, device: GPUDevice | None) -> Member | str:
    """§3.3 for one held reference."""
    if device is None:
        return f"GPUDevice {ref.name} does not exist"
    problem = unavailable(device, vmi)
    if problem is not None:
        return problem
    if not device.holds_gpus:
        return f"{ident(device)} is {_phase_words(device)}"
    cls = cluster.classes.get(device.spec.class_name)
    if cls is None:
        return f"{ident(device)}: GPUClass {device.spec.class_name} does not exist"
    problem = _node_problem(cluster, device, cls)
    return problem if problem is not None else Member(device, cls, index)


def check_template(
    cluster: Cluster,
    namespace: str,
    vmi: str,
    index: int,
    *,
    ref: TemplateRef,
    device: GPUDevice | None,
    vm: tuple[str, str] | None = None,
) -> Member | str:
    """§3.4 for one template reference; an existing matching device of this VMI is reused. `vm`: the name and uid
    of the VirtualMachine controlling the VMI, if one does (`owner_vm`)."""
    name = template_device_name(vmi, index)
    create = device is None
    if not is_object_name(name):
        # The API server checks the VMI's own name only after the mutating webhooks (its create strategy).
        return (
            f"deviceTemplate {index}: GPUDevice name {_short(name)} made from the VMI's name is not a valid object name"
        )
    if device is None:
        # §6.1, §6.5, §6.6: a VM's device is made with the owner and the in-use finalizer the collector would
        # otherwise write once the VMI appears; a bare VMI's owner is the VMI, whose uid comes only then.
        owners = [owned_by("VirtualMachine", *vm)] if vm is not None else []
        meta = ObjectMeta(
            name=name,
            namespace=namespace,
            labels={LABEL_TEMPLATE_DEVICE: TRUE},
            owner_references=owners,
            finalizers=[FINALIZER_IN_USE] if vm is not None else [],
        )
        device = GPUDevice(
            api_version=API_VERSION,
            kind="GPUDevice",
            metadata=meta,
            spec=GPUDeviceSpec(class_name=ref.class_name, count=ref.count),
        )
    elif not device.is_template:
        return f"GPUDevice {name} exists and was not made from a deviceTemplate"
    elif device.deleting:
        return f"GPUDevice {name} of an earlier VMI {vmi} is still being deleted"
    elif device.vmi_owner is not None:
        return f"GPUDevice {name} is still owned by an earlier VMI {vmi}"
    elif device.spec.class_name != ref.class_name or device.spec.count != ref.count:
        return (
            f"GPUDevice {name} (GPUClass {device.spec.class_name}, count {device.spec.count}) does not match "
            f"deviceTemplate {index} (GPUClass {ref.class_name}, count {ref.count})"
        )
    elif device.status.attached_to is not None and device.status.attached_to.vmi != vmi:
        return f"GPUDevice {name} is attached to VMI {device.status.attached_to.vmi}"
    cls = cluster.classes.get(ref.class_name)
    if cls is None:
        return f"deviceTemplate {index}: GPUClass {ref.class_name} does not exist"
    if cls.deleting and not device.holds_gpus:
        return f"deviceTemplate {index}: GPUClass {ref.class_name} is being deleted and takes no new orders"
    return Member(device, cls, index, template=True, create=create)


def _short(text: str, most: int = 80) -> str:
    return text if len(text) <= most else f"{text[:most]}... ({len(text)} characters)"


def duplicates(members: Sequence[Member]) -> str | None:
    """§3.5: one device named twice (a held reference can name a template's predictable name)."""
    seen: set[str] = set()
    for m in members:
        if m.device.name in seen:
            return f"GPUDevice {m.device.name} is referenced twice"
        seen.add(m.device.name)
    return None


def permitted_resources(cluster: Cluster) -> set[str] | None:
    """The KubeVirt permitted table; None when no KubeVirt CR sets one (the check is skipped).

    KubeVirt itself renders any host device while `permittedHostDevices` is unset."""
    tables = [kv.permitted for kv in cluster.kubevirts.values() if kv.permitted is not None]
    if not tables:
        return None
    return set().union(*tables)


def set_problem(labels: dict[str, str], members: Sequence[Member], permitted: set[str] | None) -> str | None:
    """§3.6: the set as a whole: pool mode, one vGPU class, maxCount per VM, permitted table."""
    mode = labels.get(LABEL_MODE)
    if mode is not None:
        for m in members:
            if m.cls.spec.mode.value != mode:
                return (
                    f"GPUDevice {m.device.name}: GPUClass {m.cls.name} has mode {m.cls.spec.mode.value}, "
                    f"and the VMI's pool takes mode {mode}"
                )
    vgpu: dict[str, list[str]] = defaultdict(list)
    units: dict[str, int] = defaultdict(int)
    for m in members:
        if m.cls.spec.mode is GPUMode.VGPU:
            vgpu[m.cls.name].append(m.device.name)
        units[m.cls.name] += m.device.spec.count
    if len(vgpu) > 1:
        parts = sorted(f"{', '.join(devices)} ({c})" for c, devices in vgpu.items())
        return "a VMI takes vGPU devices of one class only: " + "; ".join(parts)
    for m in members:
        limit = m.cls.effective_max_count()
        if limit is not None and units[m.cls.name] > limit:
            return f"{units[m.cls.name]} GPUs of GPUClass {m.cls.name} exceed its maxCount of {limit} per VM"
        if permitted is not None and m.cls.spec.resource_name not in permitted:
            return (
                f"GPUClass {m.cls.name}: resource {m.cls.spec.resource_name} is not in KubeVirt's "
                "permittedHostDevices, so the VM could not start"
            )
    return None


def templates_fit(cluster: Cluster, members: Sequence[Member]) -> str | None:
    """§3.7: a new template device larger than any node's allocatable could never be placed."""
    for m in members:
        if not m.template or m.device.holds_gpus:
            continue
        resource = m.cls.spec.resource_name
        most = cluster.capacity.most_units(resource)
        if m.device.spec.count > most:
            return (
                f"deviceTemplate {m.index}: no node has {m.device.spec.count} units of {resource}; "
                f"the most one has is {most}"
            )
    return None


def gpu_resource_names(cluster: Cluster, permitted: set[str] | None) -> set[str]:
    """§3.8: every class's resourceName and every entry of the permitted table."""
    return {c.spec.resource_name for c in cluster.classes.values()} | (permitted or set())


def orders(namespace: str, members: Sequence[Member]) -> dict[str, Order]:
    """§3.9: template devices that do not count against budgets yet, by device name, in entry order."""
    return {
        m.device.name: Order(namespace, m.cls.name, m.device.spec.count, f"deviceTemplate {m.index}")
        for m in members
        if m.template and not m.device.counts_against_budgets
    }


def gathered(members: Sequence[Member], node: str) -> list[str]:
    """§5.3 as the tenant reads it: each existing device of the set that the answer moved to `node`."""
    return [
        f"GPUDevice {m.device.name} from node {m.device.status.node_name}"
        for m in members
        if m.device.status.node_name and m.device.status.node_name != node
    ]


def controlling_vm(vmi: dict[str, Any]) -> tuple[str, str] | None:
    """The name and uid of the VirtualMachine controlling the VMI, if one does (`owner_vm`)."""
    ref = owner_vm(vmi)
    return (ref["name"], ref["uid"]) if ref is not None else None


def owner_vm(vmi: dict[str, Any]) -> dict[str, Any] | None:
    """A reference to the VirtualMachine that made the VMI (KubeVirt sets it as controlling owner)."""
    meta = vmi.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == "VirtualMachine" and ref.get("controller") and ref.get("name") and ref.get("uid"):
            return {
                "apiVersion": ref.get("apiVersion", KUBEVIRT_API_VERSION),
                "kind": "VirtualMachine",
                "name": ref["name"],
                "namespace": meta.get("namespace", ""),
                "uid": ref["uid"],
            }
    return None


def marked(vmi: dict[str, Any]) -> dict[str, Any]:
    """A copy of the VMI carrying the webhook's mark, which the no-bypass policy asks of every labelled VMI (§12.3),
    whatever output the set reaches its guest through."""
    out = copy.deepcopy(vmi)
    meta = out.setdefault("metadata", {})
    meta["annotations"] = {**(meta.get("annotations") or {}), ANNOTATION_ADMITTED: TRUE}
    return out
