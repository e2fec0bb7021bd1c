"""With kube-controller-manager in the control plane (a fixture option): ownership and roles work as in a cluster."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cozygpu.api import kinds
from cozygpu.devcluster import identity
from cozygpu.devcluster.controlplane import ControlPlane
from tests.support.bodies import gpu_device_body, vmi_body
from tests.support.harness import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def with_gc() -> Iterator[ControlPlane]:
    """A second control plane that also runs the garbage collector, namespace and role aggregation controllers."""
    with ControlPlane(controllers=("garbagecollector", "namespace", "clusterrole-aggregation")) as plane:
        yield plane


def test_the_ownerreference_we_write_lets_kubernetes_collect_a_template_device(with_gc: ControlPlane) -> None:
    """§6.1: the owner reference to the VMI is valid: Kubernetes' own GC deletes the device with it."""
    kube = with_gc.kube()
    kube.create(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gc"}})
    vmi = kube.create(kinds.VMI, vmi_body("vm", "gc", [{"deviceTemplate": {"className": "a10", "count": 1}}]))
    device = gpu_device_body("vm-gpu-0", "gc", "a10")
    device["metadata"]["ownerReferences"] = [
        {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": "vm", "uid": vmi["metadata"]["uid"]}
    ]
    kube.create(kinds.GPU_DEVICE, device)
    kube.delete(kinds.VMI, "vm", "gc")
    wait_for("collected", lambda: kube.get_or_none(kinds.GPU_DEVICE, "vm-gpu-0", "gc") is None, timeout=60)
    kube.delete(kinds.NAMESPACE, "gc")
    wait_for("namespace gone", lambda: kube.get_or_none(kinds.NAMESPACE, "gc") is None, timeout=60)


def test_tenant_roles_aggregate_into_the_built_in_namespace_roles(with_gc: ControlPlane) -> None:
    """§10: whoever may edit a namespace may order and release GPUs there; whoever may view it may read them."""
    kube = with_gc.kube()
    identity.install(kube, dev=False)

    def grants(role: str, resource: str, verb: str) -> bool:
        rules = kube.get(kinds.kind("ClusterRole"), role).get("rules") or []
        return any(resource in r.get("resources", []) and verb in r.get("verbs", []) for r in rules)

    for role in ("admin", "edit"):
        wait_for(f"{role} aggregated", lambda r=role: grants(r, "gpudevices", "create"), timeout=30)
        assert grants(role, "gpubudgets", "get")
    wait_for("view aggregated", lambda: grants("view", "gpudevices", "list"), timeout=30)
    assert not grants("view", "gpudevices", "create")
