"""A VM's life through KubeVirt's controllers (§2, §6, §11.1): stop and start, restart, delete."""

from __future__ import annotations

import os
import time

import pytest

from cozygpu.api import kinds
from cozygpu.kube.adapter import Kube
from tests.support import vms
from tests.support.bodies import gpu_device_body
from tests.support.harness import OperatorProcess, wait_for
from tests.support.invariants import settled
from tests.support.kubevirt import Nodes
from tests.support.nodes import Gpu
from tests.support.soak import TALLY, Budget
from tests.support.vms import bound

# KubeVirt's own bar for keeping a VM's devices across restarts (VEP 344) is 80 cycles.
CYCLES = int(os.environ.get("COZYGPU_KV_CYCLES", "100"))


@pytest.mark.timeout(0)  # make soak runs 1,000 cycles
def test_stop_and_start_keeps_the_held_gpu_on_its_node_every_time(
    kv: Kube, kv_operator: OperatorProcess, ns: str, gpu: Gpu, kv_nodes: Nodes
) -> None:
    """CYCLES stop/start cycles through runStrategy: every new VMI's launcher pod runs on the node where the
    held device was first bound, the device is never moved, and each stop releases the template device; the
    reliability tier's invariants hold at the end (make soak runs 1,000 cycles)."""
    kv_nodes.add(2)
    kv_nodes.add(8)  # emptier: the scheduler alone would drift there
    kv.create(kinds.GPU_DEVICE, gpu_device_body("keep", ns, gpu.cls))
    home = bound(kv, ns, "keep")
    kv.create(kinds.VM, vms.vm_body("vm", ns, [vms.held("keep"), vms.template(gpu.cls)]))
    seen_vmis, swaps = set(), []
    budget = Budget("stop/start through VMs")
    for cycle in range(CYCLES):
        vmi, pod = vms.running(kv, ns, "vm")
        uid = vmi["metadata"]["uid"]
        assert uid not in seen_vmis, f"cycle {cycle}: the same VMI again"
        seen_vmis.add(uid)
        keep = kv.get(kinds.GPU_DEVICE, "keep", ns)["status"]
        if (pod["spec"]["nodeName"], keep.get("nodeName"), keep.get("phase")) != (home, home, "Bound"):
            swaps.append((cycle, pod["spec"]["nodeName"], keep.get("nodeName"), keep.get("phase")))
        vms.set_running(kv, ns, "vm", False)
        vms.gone(kv, ns, "vm", uid)
        wait_for("the template device deleted", lambda: kv.get_or_none(kinds.GPU_DEVICE, "vm-gpu-1", ns) is None)
        if cycle == CYCLES - 1 or not budget.left():
            break  # the last stop stays stopped: a start for every answer counted below
        vms.set_running(kv, ns, "vm", True)
    record = TALLY["stop/start through VMs"]
    record.runs = len(seen_vmis)
    settled(kv, ns, kv_operator, record, f"after {len(seen_vmis)} stop/start cycles")
    assert record.violations == []
    assert swaps == []
    assert len(seen_vmis) == cycle + 1  # one new VMI per cycle run (all CYCLES, unless the soak ran out)
    # Each answer placed only the new template device; the held one was never gathered elsewhere.
    answers = [e for e in kv_operator.events("bind.answered") if e.get("namespace") == ns]
    assert len(answers) == len(seen_vmis)
    assert {tuple(e["moved"]) for e in answers} == {("vm-gpu-1",)}
    assert {e["node"] for e in answers} == {home}


def test_a_restart_while_the_old_launcher_pod_is_still_terminating(
    kv: Kube, kv_operator: OperatorProcess, ns: str, gpu: Gpu, kv_nodes: Nodes
) -> None:
    """A restart deletes the VMI while the VM keeps running; the old launcher pod takes its time to stop (a
    finalizer plays a slow kubelet) and holds the node's only unit meanwhile. KubeVirt keeps the old VMI until
    its pod is gone, the device stays attached to it, and the new VMI gets the same device on the same node."""
    home = kv_nodes.add(1)
    kv_nodes.add(4)  # free units elsewhere: a drifting device or pod would go here
    kv.create(kinds.GPU_DEVICE, gpu_device_body("keep", ns, gpu.cls))
    assert bound(kv, ns, "keep") == home
    kv.create(kinds.VM, vms.vm_body("vm", ns, [vms.held("keep")]))
    old_vmi, old_pod = vms.running(kv, ns, "vm")
    old_uid, name = old_vmi["metadata"]["uid"], old_pod["metadata"]["name"]
    kv.patch(kinds.POD, name, {"metadata": {"finalizers": ["cozy.test/slow-kubelet"]}}, ns)
    try:
        kv.delete(kinds.VMI, "vm", ns)
        wait_for("the old pod terminating", lambda: kv.get(kinds.POD, name, ns)["metadata"].get("deletionTimestamp"))
        time.sleep(2)  # KubeVirt's controllers and ours have had their turn with the deletion
        stopping = vms.vmi(kv, ns, "vm")
        assert stopping is not None and stopping["metadata"]["uid"] == old_uid
        assert stopping["metadata"].get("deletionTimestamp")
        keep = kv.get(kinds.GPU_DEVICE, "keep", ns)["status"]
        assert (keep["attachedTo"]["uid"], keep["nodeName"]) == (old_uid, home)
    finally:
        kv.patch(kinds.POD, name, {"metadata": {"finalizers": None}}, ns)
    _, pod = vms.running(kv, ns, "vm", not_uid=old_uid)  # the old one may show Running until it is gone
    assert (pod["spec"]["nodeName"], vms.pin_of(pod["spec"])) == (home, [home])
    keep = kv.get(kinds.GPU_DEVICE, "keep", ns)["status"]
    assert (keep["phase"], keep["nodeName"], keep["attachedTo"]["vmi"]) == ("Bound", home, "vm")


def test_deleting_the_vm_releases_everything(
    kv: Kube, kv_operator: OperatorProcess, ns: str, gpu: Gpu, kv_nodes: Nodes
) -> None:
    """§6.2: the VM deleted, its VMI and pods go, the template device is deleted and the held one detached
    (still Bound: the tenant holds it until they delete it)."""
    kv_nodes.add(2)
    kv.create(kinds.GPU_DEVICE, gpu_device_body("keep", ns, gpu.cls))
    home = bound(kv, ns, "keep")
    kv.create(kinds.VM, vms.vm_body("vm", ns, [vms.held("keep"), vms.template(gpu.cls)]))
    vmi, _ = vms.running(kv, ns, "vm")
    kv.delete(kinds.VM, "vm", ns, propagation="Foreground")
    vms.gone(kv, ns, "vm", vmi["metadata"]["uid"])
    wait_for("the template device deleted", lambda: kv.get_or_none(kinds.GPU_DEVICE, "vm-gpu-1", ns) is None)
    keep = wait_for(
        "the held device detached",
        lambda: not (d := kv.get(kinds.GPU_DEVICE, "keep", ns))["status"].get("attachedTo") and d,
    )
    assert (keep["status"]["phase"], keep["status"]["nodeName"]) == ("Bound", home)
    assert not keep["metadata"].get("finalizers")


def test_a_new_vmi_of_a_stripped_vmis_name_starts_only_once_the_old_guest_is_gone(
    kv: Kube, kv_operator: OperatorProcess, ns: str, gpu: Gpu, kv_nodes: Nodes
) -> None:
    """§6.7: after a finalizer strip the tenant creates the name again with the same held device while the old
    guest still runs. The new VMI may take the set over, but its launcher is refused while the old launcher holds
    the units (which the node's GPUNode shows as held by a pod whose VMI is gone): the set's units never serve two
    guests, so the second cannot run on units of someone else's held device. Once the old pod is gone, the new
    VMI runs on the set's node."""
    home = kv_nodes.add(4)  # room on the node: without the rule a second launcher would run at once
    kv.create(kinds.GPU_DEVICE, gpu_device_body("keep", ns, gpu.cls))
    assert bound(kv, ns, "keep") == home
    body = vms.vm_body("bare", ns, [vms.held("keep")])["spec"]["template"]
    meta = {**body["metadata"], "name": "bare", "namespace": ns}
    bare = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": meta, "spec": body["spec"]}
    kv.create(kinds.VMI, bare)
    vmi, pod = vms.running(kv, ns, "bare")
    uid, name = vmi["metadata"]["uid"], pod["metadata"]["name"]
    wait_for(
        "the uid recorded",
        lambda: (kv.get(kinds.GPU_DEVICE, "keep", ns)["status"].get("attachedTo") or {}).get("uid") == uid,
    )
    kv.patch(kinds.POD, name, {"metadata": {"finalizers": ["cozy.test/slow-kubelet"]}}, ns)
    try:
        kv.delete(kinds.VMI, "bare", ns)
        wait_for("the pod terminating", lambda: kv.get(kinds.POD, name, ns)["metadata"].get("deletionTimestamp"))
        kv.patch(kinds.VMI, "bare", {"metadata": {"finalizers": None}}, ns)
        wait_for("the VMI object gone", lambda: vms.vmi(kv, ns, "bare") is None)
        kv.create(kinds.VMI, bare)
        again = wait_for("the new VMI", lambda: vms.vmi(kv, ns, "bare"))
        refused = wait_for(
            "the new launcher refused",
            lambda: any(
                "previous guest of VMI bare" in (e.get("message") or "") for e in kv.list(kinds.kind("Event"), ns)
            ),
            timeout=60,
        )
        assert refused

        def shown() -> bool:
            status = kv.get(kinds.GPU_NODE, home).get("status") or {}
            return any(p.get("pod") == f"{ns}/{name}" for p in status.get("unmanagedPods") or [])

        wait_for("the old launcher's units shown on the GPUNode", shown)
        time.sleep(2)  # KubeVirt retries meanwhile
        started = [p for p in vms.pods_of(kv, ns, again["metadata"]["uid"]) if p["spec"].get("nodeName")]
        assert started == [], "a second guest got a node while the first still held the set's units"
    finally:
        kv.patch(kinds.POD, name, {"metadata": {"finalizers": None}}, ns)
    vmi, pod = vms.running(kv, ns, "bare", timeout=120)
    assert vmi["metadata"]["uid"] == again["metadata"]["uid"]
    assert pod["spec"]["nodeName"] == home
    keep = kv.get(kinds.GPU_DEVICE, "keep", ns)["status"]
    assert (keep["phase"], keep["nodeName"]) == ("Bound", home)
