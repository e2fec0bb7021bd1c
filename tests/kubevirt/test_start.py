"""A VM with GPUs starts through KubeVirt's own controllers, on the node of its set (§3, §11.1, §12.2)."""

from __future__ import annotations

from cozygpu.api import kinds
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import Kube
from tests.support import vms
from tests.support.bodies import gpu_device_body
from tests.support.harness import OperatorProcess
from tests.support.kubevirt import Nodes
from tests.support.nodes import Gpu
from tests.support.vms import bound


def test_a_vm_with_a_held_and_a_template_device_runs_on_the_node_of_its_set(
    kv: Kube, kv_operator: OperatorProcess, ns: str, gpu: Gpu, kv_nodes: Nodes
) -> None:
    """virt-controller makes the VMI through our webhook (two gpus entries), renders a launcher pod asking for
    2 units, our pod webhook pins it, and kube-scheduler binds it to the node holding both devices."""
    kv_nodes.add(2)
    kv_nodes.add(4)  # emptier: the scheduler alone would prefer it
    kv.create(kinds.GPU_DEVICE, gpu_device_body("keep", ns, gpu.cls))
    node = bound(kv, ns, "keep")
    kv.create(kinds.VM, vms.vm_body("vm", ns, [vms.held("keep"), vms.template(gpu.cls)]))

    vmi, pod = vms.running(kv, ns, "vm")

    assert [g["deviceName"] for g in vmi["spec"]["domain"]["devices"]["gpus"]] == [gpu.resource] * 2
    assert vms.gpu_units(pod, gpu.resource) == 2
    assert pod["spec"]["nodeName"] == node
    assert vms.pin_of(pod["spec"]) == [node]
    assert bound(kv, ns, "vm-gpu-1") == node
    assert vmi["status"]["nodeName"] == node


def test_virt_controller_counts_the_vmi_it_made_in_its_own_metrics(
    kv_plane: ControlPlane, kv: Kube, kv_operator: OperatorProcess, ns: str, gpu: Gpu, kv_nodes: Nodes
) -> None:
    """What bench/vmstart.py prints of KubeVirt's own work is virt-controller's, read over its TLS: a VM started
    is a VMI create more in its metrics, and busy time of its VM workers."""
    assert kv_plane.kubevirt is not None
    kv_nodes.add(2)
    before = kv_plane.kubevirt.controller_work()
    kv.create(kinds.VM, vms.vm_body("counted", ns, [vms.template(gpu.cls)]))
    vms.running(kv, ns, "counted")
    after = kv_plane.kubevirt.controller_work()

    assert after["CREATE count"] >= before.get("CREATE count", 0.0) + 1
    assert after["CREATE sum"] > before.get("CREATE sum", 0.0)
    assert after["work"] > before.get("work", 0.0)
