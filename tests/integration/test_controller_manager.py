"""With kube-controller-manager in the control plane (a fixture option): ownership works as in a cluster."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.devcluster.harness import wait_for
from cozygpu.kube import kinds
from tests.helpers import gpu_device_body, vmi_body

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def with_gc() -> Iterator[ControlPlane]:
    """A second control plane that also runs the garbage collector and namespace controllers."""
    with ControlPlane(controllers=("garbagecollector", "namespace")) as plane:
        yield plane


def test_the_ownerreference_we_write_lets_kubernetes_collect_a_template_device(with_gc: ControlPlane) -> None:
    """§6.1: the owner reference to the VMI is valid: Kubernetes' own GC deletes the device with it."""
    kube = with_gc.kube()
    kube.create(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gc"}})
    vmi = kube.create(kinds.VMI, vmi_body("vm", "gc", [{"deviceTemplate": {"className": "a10", "count": 1}}]))
    device = gpu_device_body("vm-gpu-0", "gc", "a10")
    device["metadata"]["ownerReferences"] = [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                                              "name": "vm", "uid": vmi["metadata"]["uid"]}]  # fmt: skip
    kube.create(kinds.GPU_DEVICE, device)
    kube.delete(kinds.VMI, "vm", "gc")
    wait_for("collected", lambda: kube.get_or_none(kinds.GPU_DEVICE, "vm-gpu-0", "gc") is None, timeout=60)
    kube.delete(kinds.NAMESPACE, "gc")
    wait_for("namespace gone", lambda: kube.get_or_none(kinds.NAMESPACE, "gc") is None, timeout=60)
