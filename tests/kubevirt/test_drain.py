"""§6.8 through KubeVirt's controllers: a node drained as `kubectl drain` does it (cordon, then the Eviction API for
each pod, retried while refused) with GPU VMs whose eviction strategy is `External`. virt-api's own eviction
admitter marks each VMI and refuses the eviction; the operator reserves a node for the VM's whole set, restarts
the VM, and the next VMI runs there with the same GPUDevices, while an order waiting for units gets none of
those; with no node to take the set, the VM keeps running and its node's GPUNode says why."""

from __future__ import annotations

import pytest

from cozygpu.api import kinds
from cozygpu.kube.adapter import Body, Kube
from tests.support import vms
from tests.support.bodies import gpu_device_body
from tests.support.harness import OperatorProcess, wait_for
from tests.support.kubevirt import Nodes
from tests.support.nodes import Gpu
from tests.support.vms import bound

DRAIN = 120.0  # seconds a drain may take here: a VM restart through KubeVirt's controllers and the fake kubelet


def _node_of(kv: Kube, ns: str, name: str) -> str | None:
    status = (kv.get_or_none(kinds.GPU_DEVICE, name, ns) or {}).get("status") or {}
    return status.get("nodeName") if status.get("phase") == "Bound" else None


def _uid(kv: Kube, ns: str, name: str) -> str:
    return str(kv.get(kinds.GPU_DEVICE, name, ns)["metadata"]["uid"])


def _evacuation(kv: Kube, node: str) -> Body:
    conditions = (kv.get_or_none(kinds.GPU_NODE, node) or {}).get("status", {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "Evacuation"), {})


@pytest.mark.timeout(300)
def test_a_drained_nodes_gpu_vm_runs_again_elsewhere_with_its_gpus_and_a_waiting_order_takes_none(
    kv: Kube, kv_operator: OperatorProcess, ns: str, gpu: Gpu, kv_nodes: Nodes
) -> None:
    """A VM with a held and a template GPU on node A; node B with room for both. Draining A: KubeVirt refuses the
    launcher's eviction and marks the VMI; the set moves to B while the VM still runs, and an order for a unit
    created then stays Pending; the VM restarts; the drain completes; the next VMI runs on B with the same two
    GPUDevices (same uids), and A's GPUNode no longer shows an evacuation."""
    home = kv_nodes.add(2)
    kv.create(kinds.GPU_DEVICE, gpu_device_body("keep", ns, gpu.cls))
    assert bound(kv, ns, "keep") == home
    kv.create(kinds.VM, vms.vm_body("vm", ns, [vms.held("keep"), vms.template(gpu.cls)], eviction="External"))
    vmi, pod = vms.running(kv, ns, "vm")
    assert pod["spec"]["nodeName"] == home and bound(kv, ns, "vm-gpu-1") == home
    uids = {name: _uid(kv, ns, name) for name in ("keep", "vm-gpu-1")}
    away = kv_nodes.add(2)

    kv.patch(kinds.NODE, home, {"spec": {"unschedulable": True}})
    refused = kv.evict(pod["metadata"]["name"], ns)
    assert "evacuation" in refused, refused  # virt-api's admitter: the VMI is marked, the eviction refused (429)
    wait_for("the set reserved on B", lambda: {_node_of(kv, ns, n) for n in uids} == {away}, timeout=DRAIN)
    kv.create(kinds.GPU_DEVICE, gpu_device_body("late", ns, gpu.cls))

    vms.drain(kv, home, DRAIN)
    _, pod = vms.running(kv, ns, "vm", timeout=DRAIN, not_uid=vmi["metadata"]["uid"])
    assert pod["spec"]["nodeName"] == away
    assert {name: _uid(kv, ns, name) for name in uids} == uids  # the same GPUDevices, none made again
    assert {_node_of(kv, ns, name) for name in uids} == {away}
    assert (kv.get(kinds.GPU_DEVICE, "late", ns).get("status") or {}).get("phase") == "Pending"
    wait_for("A's evacuation done", lambda: _evacuation(kv, home).get("status") == "False", timeout=30)


@pytest.mark.timeout(300)
def test_with_no_node_for_its_set_a_vm_keeps_running_says_why_and_leaves_once_room_appears(
    kv: Kube, kv_operator: OperatorProcess, ns: str, gpu: Gpu, kv_nodes: Nodes
) -> None:
    """A VM with two template GPUs on A, and the only other node with one unit: the drain's evictions are refused,
    the VM keeps running on A with the same VMI, A's GPUNode condition names it as blocking, and its devices carry
    an `EvacuationBlocked` Event. A node with room appears: the evacuation goes, and the drain completes."""
    home = kv_nodes.add(2)
    kv.create(kinds.VM, vms.vm_body("vm", ns, [vms.template(gpu.cls, 2)], eviction="External"))
    vmi, pod = vms.running(kv, ns, "vm")
    assert pod["spec"]["nodeName"] == home
    kv_nodes.add(1)
    kv.patch(kinds.NODE, home, {"spec": {"unschedulable": True}})
    assert "evacuation" in kv.evict(pod["metadata"]["name"], ns)

    def blocked() -> bool:
        condition = _evacuation(kv, home)
        return condition.get("reason") == "Blocked" and f"{ns}/vm" in condition.get("message", "")

    wait_for("A's GPUNode says the VM blocks the drain", blocked, timeout=30)
    events = [e for e in kv.list(kinds.kind("Event"), ns) if e.get("reason") == "EvacuationBlocked"]
    assert events and all("keeps running" in e["message"] for e in events), events
    current = vms.vmi(kv, ns, "vm")
    assert current is not None and current["metadata"]["uid"] == vmi["metadata"]["uid"]

    room = kv_nodes.add(2)
    vms.drain(kv, home, DRAIN)
    _, pod = vms.running(kv, ns, "vm", timeout=DRAIN, not_uid=vmi["metadata"]["uid"])
    assert pod["spec"]["nodeName"] == room and _node_of(kv, ns, "vm-gpu-0") == room


def _marked_vm(kv: Kube, ns: str, gpu: Gpu, kv_nodes: Nodes) -> tuple[str, str, Body]:
    """A VM with held `keep` and a template GPU running on node A, node B with room, A cordoned and the VM's
    launcher refused eviction (the VMI marked). Returns A, B and the VMI."""
    home = kv_nodes.add(2)
    kv.create(kinds.GPU_DEVICE, gpu_device_body("keep", ns, gpu.cls))
    assert bound(kv, ns, "keep") == home
    kv.create(kinds.VM, vms.vm_body("vm", ns, [vms.held("keep"), vms.template(gpu.cls)], eviction="External"))
    vmi, pod = vms.running(kv, ns, "vm")
    away = kv_nodes.add(2)
    kv.patch(kinds.NODE, home, {"spec": {"unschedulable": True}})
    assert "evacuation" in kv.evict(pod["metadata"]["name"], ns)
    return home, away, vmi


@pytest.mark.timeout(300)
def test_a_vm_deleted_mid_evacuation_lets_the_drain_complete_and_its_held_gpu_stays(
    kv: Kube, kv_operator: OperatorProcess, ns: str, gpu: Gpu, kv_nodes: Nodes
) -> None:
    """The tenant deletes the VM while its evacuation is under way: nothing starts it again, its template device
    goes (§6.6), its held device stays Bound (reserved or where it was), and the drain completes."""
    home, _, _ = _marked_vm(kv, ns, gpu, kv_nodes)
    kv.delete(kinds.VM, "vm", ns)
    vms.drain(kv, home, DRAIN)
    wait_for("the template device deleted", lambda: kv.get_or_none(kinds.GPU_DEVICE, "vm-gpu-1", ns) is None)
    assert bound(kv, ns, "keep") is not None
    assert vms.vmi(kv, ns, "vm") is None


@pytest.mark.timeout(300)
def test_a_vm_restarted_mid_evacuation_runs_on_the_other_node_with_its_gpus(
    kv: Kube, kv_operator: OperatorProcess, ns: str, gpu: Gpu, kv_nodes: Nodes
) -> None:
    """The tenant restarts the VM (`virtctl restart`) while its evacuation is under way: the next VMI, unmarked,
    gathers the set off the cordoned node, and the drain completes with the VM on B and the same GPUDevices."""
    home, away, vmi = _marked_vm(kv, ns, gpu, kv_nodes)
    uids = {name: _uid(kv, ns, name) for name in ("keep", "vm-gpu-1")}
    requests = [{"action": "Stop", "uid": vmi["metadata"]["uid"]}, {"action": "Start"}]
    kv.patch(kinds.VM, "vm", {"status": {"stateChangeRequests": requests}}, ns, subresource="status")
    vms.drain(kv, home, DRAIN)
    _, pod = vms.running(kv, ns, "vm", timeout=DRAIN, not_uid=vmi["metadata"]["uid"])
    assert pod["spec"]["nodeName"] == away
    assert {name: _uid(kv, ns, name) for name in uids} == uids
