"""§6.6 through KubeVirt's controllers: a VM's restart keeps its template GPUs, in a cloud with no room left and an
order waiting for one; a stop or the VM's deletion lets them go to that order."""

from __future__ import annotations

import os

import pytest

from cozygpu.api import kinds
from cozygpu.kube.adapter import Body, Kube
from tests.support import vms
from tests.support.bodies import gpu_device_body
from tests.support.harness import OperatorProcess, wait_for
from tests.support.kubevirt import Nodes
from tests.support.nodes import Gpu
from tests.support.vms import bound

RESTARTS = int(os.environ.get("COZYGPU_KV_RESTARTS", "100"))


def _full_cloud_with_a_vm(kv: Kube, ns: str, gpu: Gpu, kv_nodes: Nodes) -> tuple[str, Body]:
    """One node of 2 units: held `keep` and VM `vm`'s template device on it, and held `waiting` Pending for a
    unit. Returns the node and the running VMI."""
    home = kv_nodes.add(2)
    kv.create(kinds.GPU_DEVICE, gpu_device_body("keep", ns, gpu.cls))
    assert bound(kv, ns, "keep") == home
    kv.create(kinds.VM, vms.vm_body("vm", ns, [vms.held("keep"), vms.template(gpu.cls)]))
    vmi, _ = vms.running(kv, ns, "vm")
    assert bound(kv, ns, "vm-gpu-1") == home
    kv.create(kinds.GPU_DEVICE, gpu_device_body("waiting", ns, gpu.cls))
    wait_for("the waiting order seen", lambda: _phase(kv, ns, "waiting") == "Pending")
    return home, vmi


def restart(kv: Kube, ns: str, uid: str) -> None:
    """What `virtctl restart` asks of virt-api, which writes it so: stop the VMI of this uid, then start again."""
    requests = [{"action": "Stop", "uid": uid}, {"action": "Start"}]
    kv.patch(kinds.VM, "vm", {"status": {"stateChangeRequests": requests}}, ns, subresource="status")


def _phase(kv: Kube, ns: str, name: str) -> str | None:
    phase: str | None = ((kv.get_or_none(kinds.GPU_DEVICE, name, ns) or {}).get("status") or {}).get("phase")
    return phase


@pytest.mark.timeout(0)  # COZYGPU_KV_RESTARTS may be large
def test_a_vm_restarted_again_and_again_keeps_its_template_gpu_and_the_waiting_order_gets_it_at_stop(
    kv: Kube, kv_operator: OperatorProcess, ns: str, gpu: Gpu, kv_nodes: Nodes
) -> None:
    """RESTARTS restarts as `virtctl restart` asks them (KubeVirt deletes the VMI and makes a new one): every new
    VMI runs on the same node with the same template device, never deleted nor made again, while an older order
    waits for a unit; the VM stopped, the device goes and the waiting order is Bound in its place."""
    home, vmi = _full_cloud_with_a_vm(kv, ns, gpu, kv_nodes)
    device_uid = kv.get(kinds.GPU_DEVICE, "vm-gpu-1", ns)["metadata"]["uid"]
    owners = kv.get(kinds.GPU_DEVICE, "vm-gpu-1", ns)["metadata"].get("ownerReferences") or []
    assert [o["kind"] for o in owners] == ["VirtualMachine"]
    lost = []
    for n in range(RESTARTS):
        old = vmi["metadata"]["uid"]
        restart(kv, ns, old)
        vmi, pod = vms.running(kv, ns, "vm", not_uid=old)  # the old VMI may still run a moment after the ask
        template = kv.get_or_none(kinds.GPU_DEVICE, "vm-gpu-1", ns) or {}
        got = (
            (template.get("metadata") or {}).get("uid"),
            (template.get("status") or {}).get("nodeName"),
            pod["spec"]["nodeName"],
            _phase(kv, ns, "waiting"),
        )
        if got != (device_uid, home, home, "Pending"):
            lost.append((n, got))
    assert lost == [], f"restarts where the VM's GPU changed or the waiting order took it: {lost[:5]}"
    vms.set_running(kv, ns, "vm", False)
    vms.gone(kv, ns, "vm", vmi["metadata"]["uid"])
    wait_for("the template device deleted", lambda: kv.get_or_none(kinds.GPU_DEVICE, "vm-gpu-1", ns) is None)
    assert bound(kv, ns, "waiting") == home


def test_a_vm_deleted_during_its_restart_releases_its_kept_gpu(
    kv: Kube, kv_operator: OperatorProcess, ns: str, gpu: Gpu, kv_nodes: Nodes
) -> None:
    """The VMI deleted and the VM kept running, then the VM deleted before a new VMI runs: the kept template
    device is deleted (its VM is gone), so the waiting order is Bound on the freed unit."""
    home, vmi = _full_cloud_with_a_vm(kv, ns, gpu, kv_nodes)
    restart(kv, ns, vmi["metadata"]["uid"])
    vms.gone(kv, ns, "vm", vmi["metadata"]["uid"])
    kv.delete(kinds.VM, "vm", ns)
    wait_for("the template device deleted", lambda: kv.get_or_none(kinds.GPU_DEVICE, "vm-gpu-1", ns) is None)
    assert bound(kv, ns, "waiting") == home
