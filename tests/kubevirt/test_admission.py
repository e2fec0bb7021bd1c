"""Admission as a tenant meets it through a VM (§3, §5.3, §11.1): refusals on the VM, KubeVirt's retry,
virt-api's own mutator, a gather, two VMs racing for one device."""

from __future__ import annotations

import threading

from cozygpu.api import kinds
from cozygpu.kube.adapter import Body, Kube
from tests.support import vms
from tests.support.bodies import gpu_device_body
from tests.support.harness import OperatorProcess, wait_for
from tests.support.kubevirt import Nodes
from tests.support.nodes import Gpu
from tests.support.vms import bound


def failure(kv: Kube, ns: str, vm: str) -> Body:
    """Wait until the VM shows a Failure condition; return it."""
    return wait_for(f"VM {vm} Failure", lambda: vms.condition(kv.get(kinds.VM, vm, ns), "Failure"))


def test_a_refusal_reaches_the_vms_status_and_kubevirts_retry_starts_it_once_capacity_frees(
    kv: Kube, kv_operator: OperatorProcess, ns: str, gpu: Gpu, kv_nodes: Nodes
) -> None:
    """No free unit: the binder's reason is the VM's Failure condition and no VMI exists. The tenant frees a
    unit (deletes another held device) and KubeVirt's own retry creates the VMI, which runs."""
    node = kv_nodes.add(1)
    kv.create(kinds.GPU_DEVICE, gpu_device_body("blocker", ns, gpu.cls))
    bound(kv, ns, "blocker")
    kv.create(kinds.VM, vms.vm_body("vm", ns, [vms.template(gpu.cls)]))
    condition = failure(kv, ns, "vm")
    assert condition["reason"] == "FailedCreate"
    assert 'admission webhook "vmi.gpu.cozystack.io" denied the request' in condition["message"]
    assert f"no node has 1 free unit of {gpu.resource}" in condition["message"]
    assert vms.vmi(kv, ns, "vm") is None
    kv.delete(kinds.GPU_DEVICE, "blocker", ns)
    _, pod = vms.running(kv, ns, "vm", timeout=120)
    assert pod["spec"]["nodeName"] == node


def test_virt_apis_mutator_runs_before_ours_and_ours_is_called_once(
    kv: Kube, kv_operator: OperatorProcess, ns: str, gpu: Gpu, kv_nodes: Nodes
) -> None:
    """The API server calls virt-api's mutator (KubeVirt's defaults), then ours, whose configuration sorts after
    it: the VMI carries both, and ours was called once, with no reinvocation to answer."""
    kv_nodes.add(2)
    kv.create(kinds.VM, vms.vm_body("vm", ns, [vms.template(gpu.cls, 2)]))
    vmi, _ = vms.running(kv, ns, "vm")
    gpus = vmi["spec"]["domain"]["devices"]["gpus"]
    assert gpus == [
        {"name": "gpudev0-0", "deviceName": gpu.resource},
        {"name": "gpudev0-1", "deviceName": gpu.resource},
    ]
    assert vmi["spec"]["domain"]["machine"]["type"] == "q35"  # virt-api's default
    admitted = [e for e in kv_operator.events("vmi.admitted") if e.get("namespace") == ns]
    assert len(admitted) == 1, admitted
    assert len([e for e in kv_operator.events("vmi.bound") if e.get("namespace") == ns]) == 1


def test_a_held_device_on_a_cordoned_node_is_gathered_and_the_vm_says_so(
    kv: Kube, kv_operator: OperatorProcess, ns: str, gpu: Gpu, kv_nodes: Nodes
) -> None:
    """§3.3, §5.3: a cordoned node is no refusal; the binder moves the held device to a node that can take the
    set, the VM runs there, and the tenant reads why on the VM (GPUsGathered) and the device (Moved)."""
    old = kv_nodes.add(1)
    kv.create(kinds.GPU_DEVICE, gpu_device_body("keep", ns, gpu.cls))
    assert bound(kv, ns, "keep") == old
    new = kv_nodes.add(1)
    kv.patch(kinds.NODE, old, {"spec": {"unschedulable": True}})
    kv.create(kinds.VM, vms.vm_body("vm", ns, [vms.held("keep")]))
    _, pod = vms.running(kv, ns, "vm")
    assert pod["spec"]["nodeName"] == new
    assert kv.get(kinds.GPU_DEVICE, "keep", ns)["status"]["nodeName"] == new

    def reasons(kind: str, name: str) -> list[str]:
        events = kv.list(kinds.kind("Event"), ns)
        return [
            e["message"]
            for e in events
            if e["involvedObject"]["kind"] == kind
            and e["involvedObject"]["name"] == name
            and e["reason"] in ("GPUsGathered", "Moved")
        ]

    vm_events = wait_for("the VM's GPUsGathered Event", lambda: reasons("VirtualMachine", "vm"))
    assert vm_events == [f"GPUs gathered on node {new}: GPUDevice keep from node {old}"]
    device_events = wait_for("the device's Moved Event", lambda: reasons("GPUDevice", "keep"))
    assert device_events == [f"moved from node {old} to {new} for VMI vm"]


def test_two_vms_racing_for_one_held_device(
    kv: Kube, kv_operator: OperatorProcess, ns: str, gpu: Gpu, kv_nodes: Nodes
) -> None:
    """Both VMs start at once naming the same held device: exactly one runs with it; the other's VM says the
    device is attached to the winner's VMI, and nothing is left attached to the loser."""
    kv_nodes.add(2)
    kv.create(kinds.GPU_DEVICE, gpu_device_body("shared", ns, gpu.cls))
    bound(kv, ns, "shared")
    start = threading.Barrier(2)

    def create(name: str) -> None:
        start.wait()
        kv.create(kinds.VM, vms.vm_body(name, ns, [vms.held("shared")]))

    threads = [threading.Thread(target=create, args=(n,)) for n in ("vm-a", "vm-b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    def settled() -> tuple[str, str] | None:
        running = [n for n in ("vm-a", "vm-b") if (v := vms.vmi(kv, ns, n)) and v["status"].get("phase") == "Running"]
        failed = [n for n in ("vm-a", "vm-b") if vms.condition(kv.get(kinds.VM, n, ns), "Failure")]
        return (running[0], failed[0]) if len(running) == 1 and len(failed) == 1 else None

    winner, loser = wait_for("one VM running, the other refused", settled, timeout=60)
    assert winner != loser
    message = vms.condition(kv.get(kinds.VM, loser, ns), "Failure")["message"]  # type: ignore[index]
    assert "GPUDevice shared" in message and f"is attached to VMI {winner}" in message
    assert kv.get(kinds.GPU_DEVICE, "shared", ns)["status"]["attachedTo"]["vmi"] == winner
    assert vms.vmi(kv, ns, loser) is None
