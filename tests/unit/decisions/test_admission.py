"""The VMI admission rules of §3 that need no API server: checks, entries, patches, reinvocation."""

from __future__ import annotations

import datetime as dt
from typing import Any

from cozygpu.api import GPUDevice, kinds
from cozygpu.api.names import FINALIZER_IN_USE
from cozygpu.api.references import HeldRef, TemplateRef
from cozygpu.decisions import admission, attach
from cozygpu.decisions.admission import Member
from cozygpu.decisions.outputs import DEVICE_PLUGIN
from cozygpu.runtime.view import View
from cozygpu.state.cluster import Cluster
from tests.support.views import A10, EPOCH, L40S, cluster, device, gpu_class, node, request

NOW = EPOCH + dt.timedelta(seconds=30)


def model(body: dict[str, Any]) -> GPUDevice:
    return GPUDevice.from_wire(body)


def member(c: Cluster, body: dict[str, Any], index: int = 0, template: bool = False) -> Member:
    d = model(body)
    return Member(d, c.classes[d.spec.class_name], index, template=template)


def base() -> Cluster:
    return cluster(nodes=[node("n1", {A10: 4}, labels={"gpu": "a10"})], classes=[gpu_class("a10")])


# -- §3.3 held references ----------------------------------------------------------


def test_a_bound_held_device_is_a_member() -> None:
    """A Bound device, attached to nothing, on a node that serves its class, joins the set."""
    c = base()
    result = admission.check_held(c, "vm", 0, HeldRef("d"), model(device("d", phase="Bound", node_name="n1")))
    assert isinstance(result, Member)


def test_held_refusals_name_the_device_and_the_reason() -> None:
    """§3.3: missing, deleting, attached elsewhere (naming VMI and node), not holding GPUs, class gone."""
    c = base()
    deleting = device("d", phase="Bound", node_name="n1")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    attached = device("d", phase="Bound", node_name="n1", status={"attachedTo": {"vmi": "other"}})
    cases = {
        None: "GPUDevice d does not exist",
        "deleting": "GPUDevice d (node n1) is being deleted",
        "attached": "GPUDevice d (node n1) is attached to VMI other",
        "pending": "GPUDevice d is Pending and holds no GPUs yet",
        "lost": "GPUDevice d (node gone) is Lost and holds no GPUs",
        "classless": "GPUDevice d (node n1): GPUClass nope does not exist",
    }
    bodies: dict[str | None, dict[str, Any] | None] = {
        None: None,
        "deleting": deleting,
        "attached": attached,
        "pending": device("d", phase="Pending"),
        "lost": device("d", phase="Lost", node_name="gone"),
        "classless": device("d", "nope", phase="Bound", node_name="n1"),
    }
    for case, expected in cases.items():
        body = bodies[case]
        assert admission.check_held(c, "vm", 0, HeldRef("d"), model(body) if body else None) == expected


def test_a_node_that_no_longer_serves_the_class_is_a_refusal() -> None:
    """§3.3: node labels stopped matching the class's nodeSelector."""
    c = cluster(nodes=[node("n1", {A10: 4})], classes=[gpu_class("a10", nodeSelector={"gpu": "a10"})])
    result = admission.check_held(c, "vm", 0, HeldRef("d"), model(device("d", phase="Bound", node_name="n1")))
    assert result == "GPUDevice d: node n1 no longer serves GPUClass a10"


def test_lost_capacity_refuses_only_with_not_ready_or_overcommit() -> None:
    """§3.3: LostCapacity plus NotReady refuses; a merely cordoned or NotReady node is the binder's to gather."""
    lost_condition = {"type": "LostCapacity", "status": "True", "reason": "NodeNotReady", "message": ""}
    gpunode = {"metadata": {"name": "n1", "resourceVersion": "1"}, "status": {"conditions": [lost_condition]}}
    bound = model(device("d", phase="Bound", node_name="n1"))
    down = cluster(nodes=[node("n1", {A10: 4}, ready=False)], classes=[gpu_class("a10")])
    View(down).apply(kinds.GPU_NODE, gpunode)
    assert admission.check_held(down, "vm", 0, HeldRef("d"), bound) == "GPUDevice d: node n1 has lost capacity"
    not_lost = cluster(nodes=[node("n1", {A10: 4}, ready=False)], classes=[gpu_class("a10")])
    assert isinstance(admission.check_held(not_lost, "vm", 0, HeldRef("d"), bound), Member)


# -- §3.4 template references -----------------------------------------------------


def test_a_missing_template_device_is_to_be_created() -> None:
    """The predictable name v-gpu-<i>, the template label, the entry's class and count."""
    result = admission.check_template(base(), "t1", "vm", 2, ref=TemplateRef("a10", 3), device=None)
    assert isinstance(result, Member)
    assert (result.device.name, result.device.spec.count, result.create) == ("vm-gpu-2", 3, True)
    assert result.device.metadata.labels == {"gpu.cozystack.io/template-device": "true"}


def test_a_vms_template_device_is_made_with_its_owner_and_in_use_finalizer() -> None:
    """§6.1, §6.5, §6.6 (issue 37 item 8): the VM controlling the VMI owns the device from its create, which
    carries the in-use finalizer too, so the collector writes neither once the VMI appears; a bare VMI's
    device is made with neither (its owner, the VMI, has no uid until it is stored)."""
    made = admission.check_template(base(), "t1", "vm", 0, ref=TemplateRef("a10", 1), device=None, vm=("vm", "u-vm"))
    assert isinstance(made, Member)
    [owner] = made.device.metadata.owner_references
    assert (owner.kind, owner.name, owner.uid, owner.api_version) == ("VirtualMachine", "vm", "u-vm", "kubevirt.io/v1")
    assert made.device.metadata.finalizers == [FINALIZER_IN_USE]
    assert made.device.vm_owner is not None and made.device.vm_owner.uid == "u-vm"
    bare = admission.check_template(base(), "t1", "vm", 0, ref=TemplateRef("a10", 1), device=None)
    assert isinstance(bare, Member)
    assert (bare.device.metadata.owner_references, bare.device.metadata.finalizers) == ([], [])


def test_the_controlling_vm_is_read_from_the_vmis_owner_references() -> None:
    """Only a controlling VirtualMachine reference counts: another owner, or a VM that does not control, is none."""
    vm = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": "vm", "uid": "u-vm", "controller": True}
    vmi = {"metadata": {"name": "vm", "namespace": "t1", "ownerReferences": [vm]}}
    assert admission.controlling_vm(vmi) == ("vm", "u-vm")
    vmi["metadata"]["ownerReferences"] = [{**vm, "controller": False}, {**vm, "kind": "ReplicaSet"}]
    assert admission.controlling_vm(vmi) is None


def test_template_refusals() -> None:
    """§3.4: not from a template, owned by an earlier VMI, other class or count, attached elsewhere."""
    c = base()
    ref = TemplateRef("a10", 1)
    plain = device("vm-gpu-0")
    owned = device("vm-gpu-0", template=True)
    owned["metadata"]["ownerReferences"] = [
        {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": "vm", "uid": "old"}
    ]
    other = device("vm-gpu-0", count=2, template=True)
    attached = device("vm-gpu-0", template=True, status={"attachedTo": {"vmi": "x"}})
    assert admission.check_template(c, "t1", "vm", 0, ref=ref, device=model(plain)) == (
        "GPUDevice vm-gpu-0 exists and was not made from a deviceTemplate"
    )
    assert admission.check_template(c, "t1", "vm", 0, ref=ref, device=model(owned)) == (
        "GPUDevice vm-gpu-0 is still owned by an earlier VMI vm"
    )
    assert "does not match deviceTemplate 0" in str(
        admission.check_template(c, "t1", "vm", 0, ref=ref, device=model(other))
    )
    assert admission.check_template(c, "t1", "vm", 0, ref=ref, device=model(attached)) == (
        "GPUDevice vm-gpu-0 is attached to VMI x"
    )
    assert admission.check_template(c, "t1", "vm", 0, ref=TemplateRef("nope", 1), device=None) == (
        "deviceTemplate 0: GPUClass nope does not exist"
    )


def test_a_class_being_deleted_takes_no_new_template_orders() -> None:
    """§1.1/§3.4: a deleting class refuses a new device but keeps one that already holds GPUs."""
    cls = gpu_class("a10")
    cls["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    c = cluster(nodes=[node("n1", {A10: 4})], classes=[cls])
    assert "is being deleted and takes no new orders" in str(
        admission.check_template(c, "t1", "vm", 0, ref=TemplateRef("a10", 1), device=None)
    )
    bound = model(device("vm-gpu-0", template=True, phase="Bound", node_name="n1"))
    assert isinstance(admission.check_template(c, "t1", "vm", 0, ref=TemplateRef("a10", 1), device=bound), Member)


# -- §3.5-§3.8 -----------------------------------------------------------------


def test_one_device_twice_is_refused() -> None:
    """§3.5: the set names each device once."""
    c = base()
    m = member(c, device("d", phase="Bound", node_name="n1"))
    assert admission.duplicates([m, m]) == "GPUDevice d is referenced twice"


def test_set_rules() -> None:
    """§3.6: the pool's mode, one vGPU class per VMI, maxCount per VM, KubeVirt's permitted table."""
    c = cluster(classes=[gpu_class("a10", maxCount=2), gpu_class("v1", L40S, "vgpu"), gpu_class("v2", "x/y", "vgpu")])
    a, b = member(c, device("a", "a10", 1)), member(c, device("b", "a10", 2), 1)
    v1, v2 = member(c, device("v1", "v1")), member(c, device("v2", "v2"), 1)
    assert "the VMI's pool takes mode vgpu" in str(admission.set_problem({"gpu.cozystack.io/mode": "vgpu"}, [a], None))
    assert admission.set_problem({}, [v1, v2], None) == "a VMI takes vGPU devices of one class only: v1 (v1); v2 (v2)"
    assert admission.set_problem({}, [a, b], None) == "3 GPUs of GPUClass a10 exceed its maxCount of 2 per VM"
    assert "not in KubeVirt's permittedHostDevices" in str(admission.set_problem({}, [a], {L40S}))
    assert admission.set_problem({}, [a], {A10}) is None
    assert admission.set_problem({}, [a], None) is None


def test_the_permitted_table_is_kubevirts_own_reading_of_its_cr() -> None:
    """§3.6: no KubeVirt CR, or one without permittedHostDevices, restricts nothing (KubeVirt then renders
    any device); a table, even an empty one, is the list."""
    c = cluster()
    assert admission.permitted_resources(c) is None
    kv = {"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt", "spec": {"configuration": {}}}
    View(c).apply(
        kinds.KUBEVIRT, {**kv, "metadata": {"name": "kubevirt", "namespace": "kubevirt", "resourceVersion": "1"}}
    )
    assert admission.permitted_resources(c) is None
    table = {"pciHostDevices": [{"pciVendorSelector": "10DE:2236", "resourceName": A10}]}
    View(c).apply(
        kinds.KUBEVIRT,
        {
            "metadata": {"name": "kubevirt", "namespace": "kubevirt", "resourceVersion": "2"},
            "spec": {"configuration": {"permittedHostDevices": table}},
        },
    )
    assert admission.permitted_resources(c) == {A10}
    View(c).apply(
        kinds.KUBEVIRT,
        {
            "metadata": {"name": "kubevirt", "namespace": "kubevirt", "resourceVersion": "3"},
            "spec": {"configuration": {"permittedHostDevices": {}}},
        },
    )
    assert admission.permitted_resources(c) == set()


def test_a_template_larger_than_any_node_is_refused_saying_the_most() -> None:
    """§3.7: say the most one node has of the resource."""
    c = base()
    m = member(c, device("vm-gpu-0", count=5, template=True), template=True)
    assert admission.templates_fit(c, [m]) == f"deviceTemplate 0: no node has 5 units of {A10}; the most one has is 4"


def test_own_gpu_entries_are_found_and_ours_are_not() -> None:
    """§3.8: foreign gpus, GPU hostDevices and GPU resource keys are the VMI's own; earlier entries of ours are not."""
    desired = [{"name": "gpudev0-0", "deviceName": A10}]
    vmi = {
        "spec": {
            "domain": {
                "devices": {
                    "gpus": [{"name": "gpudev0-0", "deviceName": A10}, {"name": "mine", "deviceName": A10}],
                    "hostDevices": [{"name": "hd", "deviceName": A10}, {"name": "nic", "deviceName": "intel/nic"}],
                },
                "resources": {"limits": {A10: "1", "cpu": "2"}},
            }
        }
    }
    assert DEVICE_PLUGIN.foreign(vmi, desired, {A10}) == ["gpus mine", "hostDevices hd", f"resources.limits {A10}"]
    clean = {"spec": {"domain": {"devices": {"gpus": desired}}}}
    assert DEVICE_PLUGIN.foreign(clean, desired, {A10}) == []


def test_desired_gpus_are_one_per_unit_named_by_entry_and_unit() -> None:
    """§1.5: gpudev<i>-<j> with the class's resource name."""
    c = base()
    members = [member(c, device("d", count=2)), member(c, device("vm-gpu-1"), 1, template=True)]
    assert DEVICE_PLUGIN.entries(members) == [
        {"name": "gpudev0-0", "deviceName": A10},
        {"name": "gpudev0-1", "deviceName": A10},
        {"name": "gpudev1-0", "deviceName": A10},
    ]


# -- the patch and reinvocation ---------------------------------------------------


def test_pinning_adds_match_fields_to_every_required_term() -> None:
    """§3: every required node-affinity term gets metadata.name In [node]; none: one is created."""
    gpus = [{"name": "gpudev0-0", "deviceName": A10}]
    bare = DEVICE_PLUGIN.admitted({"spec": {"domain": {}}}, gpus, "n1")
    terms = bare["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]
    zones = [{"matchExpressions": [{"key": "zone", "operator": "In", "values": [z]}]} for z in ("a", "b")]
    two = {
        "spec": {
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": zones}}
            }
        }
    }
    pinned = DEVICE_PLUGIN.admitted(two, gpus, "n1")
    for term in pinned["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]:
        assert term["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]
        assert term["matchExpressions"]
    assert pinned["spec"]["domain"]["devices"]["gpus"] == gpus


def test_pinning_is_idempotent() -> None:
    """A reinvocation that finds the pin and entries in place changes nothing."""
    gpus = [{"name": "gpudev0-0", "deviceName": A10}]
    once = DEVICE_PLUGIN.admitted(admission.marked({"spec": {}}), gpus, "n1")
    assert DEVICE_PLUGIN.admitted(admission.marked(once), gpus, "n1") == once


def test_a_recent_succeeded_request_for_this_vmi_is_its_own_answer() -> None:
    """§3: same VMI, same devices, Succeeded, younger than a minute, one node: no new bind."""
    c = base()
    answered = request("r", "vm", ["d"], EPOCH, result="Succeeded")
    m = member(c, device("d", phase="Bound", node_name="n1", status=answered))
    assert attach.already_placed([m], "vm", NOW) == "n1"
    assert attach.already_placed([m], "vm", EPOCH + dt.timedelta(minutes=2)) is None
    assert attach.already_placed([m], "other", NOW) is None


def test_an_answer_to_an_earlier_vmi_of_the_name_is_not_this_creates_own() -> None:
    """A VMI under admission has no uid yet: an attachment carrying one was made for an earlier VMI object."""
    c = base()
    answered = request("r", "vm", ["d"], EPOCH, result="Succeeded")
    answered["attachedTo"]["uid"] = "uid-of-the-vmi-that-was"
    m = member(c, device("d", phase="Bound", node_name="n1", status=answered))
    assert attach.already_placed([m], "vm", NOW) is None


def test_a_gather_is_told_per_moved_device_and_to_the_vm_that_made_the_vmi() -> None:
    """§5.3: devices Bound or Lost elsewhere are named with the node they left; new and staying ones are not.
    The Event goes to the VMI's controlling VirtualMachine, when there is one."""
    c = base()
    stay = member(c, device("stay", phase="Bound", node_name="n1"))
    moved = member(c, device("far", phase="Lost", node_name="n2"), 1)
    new = member(c, device("new"), 2)
    assert admission.gathered([stay, moved, new], "n1") == ["GPUDevice far from node n2"]
    owner = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": "vm", "uid": "u", "controller": True}
    vmi = {"metadata": {"name": "vm", "namespace": "t1", "ownerReferences": [owner]}}
    reference = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": "vm", "namespace": "t1", "uid": "u"}
    assert admission.owner_vm(vmi) == reference
    assert admission.owner_vm({"metadata": {"name": "bare"}}) is None


def test_an_undo_takes_back_its_own_request_and_the_attachment_it_made() -> None:
    """§3: a refusal clears exactly what its call wrote: its request, and its attachment while no VMI claimed it."""
    mine = GPUDevice.from_wire(device("a", status=request("r1", "vm", ["a"], EPOCH)))
    undone = attach.undone(mine, "vm", "r1", attached_by_us=True)
    assert undone is not None and undone.status.bind_request is None and undone.status.attached_to is None
    kept = attach.undone(mine, "vm", "r1", attached_by_us=False)
    assert kept is not None and kept.status.bind_request is None and kept.status.attached_to is not None


def test_an_undo_leaves_what_others_wrote() -> None:
    """Another call's request, or an attachment a VMI object has claimed (uid recorded), is not this undo's."""
    theirs = GPUDevice.from_wire(device("a", status=request("r2", "vm", ["a"], EPOCH)))
    assert attach.undone(theirs, "vm", "r1", attached_by_us=False) is None
    claimed = request("r1", "vm", ["a"], EPOCH)
    claimed["attachedTo"]["uid"] = "u1"
    undone = attach.undone(GPUDevice.from_wire(device("a", status=claimed)), "vm", "r1", attached_by_us=True)
    assert undone is not None and undone.status.attached_to is not None and undone.status.bind_request is None


def test_a_template_device_another_create_of_the_name_took_is_not_the_creators_to_delete() -> None:
    """Issue 12 item 7: the creator's undo deletes its template device only while nothing but its own request
    (or none) is on it; a uid the collector recorded for a running VMI of the name does not make it that VMI's."""
    untouched = GPUDevice.from_wire(device("vm-gpu-0"))
    assert not attach.taken_over(untouched, "r1")
    own = GPUDevice.from_wire(device("vm-gpu-0", status=request("r1", "vm", ["vm-gpu-0"], EPOCH)))
    assert not attach.taken_over(own, "r1")
    theirs = GPUDevice.from_wire(device("vm-gpu-0", status=request("r2", "vm", ["vm-gpu-0"], EPOCH)))
    assert attach.taken_over(theirs, "r1")
    claimed = request("r1", "vm", ["vm-gpu-0"], EPOCH)
    claimed["attachedTo"]["uid"] = "u1"
    assert not attach.taken_over(GPUDevice.from_wire(device("vm-gpu-0", status=claimed)), "r1")


def test_malformed_gpu_fields_are_named_not_spelled_out_letter_by_letter() -> None:
    """Issue 12: a string `gpus` was iterated as a list ("gpus , gpus , ..."); entries that are no objects, or
    resources that are no map, are named once, and no Python error reaches the tenant."""
    vmi: dict[str, Any] = {
        "spec": {"domain": {"devices": {"gpus": "nvidia", "hostDevices": 3}, "resources": {"limits": "lots"}}}
    }
    assert DEVICE_PLUGIN.foreign(vmi, [], {A10}) == ["gpus (not a list)", "hostDevices (not a list)"]
    vmi["spec"]["domain"]["devices"] = {"gpus": [7, {"name": "g", "deviceName": A10}]}
    assert DEVICE_PLUGIN.foreign(vmi, [], {A10}) == ["gpus entry 0 (not an object)", "gpus g"]
