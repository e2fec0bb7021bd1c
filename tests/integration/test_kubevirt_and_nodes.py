"""KubeVirt's real VMI schema and the fake GPU nodes are in place for the operator's tests."""

from __future__ import annotations

import subprocess

import pytest

from cozygpu.api import kinds
from cozygpu.api.names import LABEL_DEVICE_REFERENCE
from cozygpu.devcluster import binaries, nodes
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import Invalid, Kube
from tests.support import bodies
from tests.support.bodies import A10
from tests.support.nodes import GPUNodeFactory

pytestmark = pytest.mark.integration
UNMANAGED = "example.com/schema-only-gpu"  # no GPUClass names it


def vmi_body(name: str, namespace: str, gpus: list[dict[str, str]]) -> dict[str, object]:
    """A VMI carrying `gpus` entries of its own, of a resource no GPUClass names: KubeVirt's schema alone, with no
    operator. (A labelled VMI, or a managed resource, is the no-bypass policies' to refuse while no operator serves,
    and deleting them would freeze their parameters in the API server: docs/admission.md.)"""
    domain = {"devices": {"gpus": gpus}, "resources": {"requests": {"memory": "1Gi"}}}
    body = bodies.vmi_body(name, namespace, [{"device": "d1"}], domain=domain)
    del body["metadata"]["labels"][LABEL_DEVICE_REFERENCE]
    return body


def test_vmi_with_gpus_entries_is_stored_with_kubevirts_schema(kube: Kube, namespace: str) -> None:
    """A VMI carrying spec.domain.devices.gpus entries is accepted and kept as written."""
    gpus = [{"name": "gpudev0-0", "deviceName": UNMANAGED}, {"name": "gpudev0-1", "deviceName": UNMANAGED}]
    kube.create(kinds.VMI, vmi_body("vm1", namespace, gpus))
    stored = kube.get(kinds.VMI, "vm1", namespace)
    assert stored["spec"]["domain"]["devices"]["gpus"] == gpus


def test_vmi_schema_is_enforced(kube: Kube, namespace: str) -> None:
    """The KubeVirt schema is live: a gpus entry without a name is refused."""
    with pytest.raises(Invalid, match="name"):
        kube.create(kinds.VMI, vmi_body("vm2", namespace, [{"deviceName": UNMANAGED}]))


def test_gpu_node_has_allocatable_gpus_labels_taints_and_ready(kube: Kube, gpu_node: GPUNodeFactory) -> None:
    """The node helper writes GPUs into status.allocatable and a Ready condition, through the API."""
    taint = {"key": "gpu", "value": "a10", "effect": "NoSchedule"}
    made = gpu_node({A10: 4}, labels={"gpu": "a10"}, taints=[taint])
    stored = kube.get(kinds.NODE, made["metadata"]["name"])
    assert stored["status"]["allocatable"][A10] == "4"
    assert stored["metadata"]["labels"]["gpu"] == "a10"
    assert stored["spec"]["taints"] == [taint]
    ready = [c for c in stored["status"]["conditions"] if c["type"] == "Ready"]
    assert ready[0]["status"] == "True"


def test_gpu_node_can_be_cordoned_made_not_ready_and_resized(kube: Kube, gpu_node: GPUNodeFactory) -> None:
    """The helpers change readiness and GPU counts the way a kubelet would report them."""
    name = gpu_node({A10: 2}, unschedulable=True)["metadata"]["name"]
    assert kube.get(kinds.NODE, name)["spec"]["unschedulable"] is True
    nodes.set_ready(kube, name, False)
    conditions = kube.get(kinds.NODE, name)["status"]["conditions"]
    assert [c["status"] for c in conditions if c["type"] == "Ready"] == ["False"]
    assert nodes.NOT_READY_TAINT in kube.get(kinds.NODE, name)["spec"]["taints"]
    nodes.set_ready(kube, name, True)
    assert not kube.get(kinds.NODE, name)["spec"].get("taints")
    nodes.set_gpus(kube, name, {A10: 1})
    assert kube.get(kinds.NODE, name)["status"]["allocatable"][A10] == "1"
    nodes.set_gpus(kube, name, {A10: 0})
    assert A10 not in kube.get(kinds.NODE, name)["status"]["allocatable"]


def test_kubectl_lists_and_explains_our_kinds(control_plane: ControlPlane) -> None:
    """kubectl of the same release sees the CRDs: `get gpudevices -A` and `explain gpudevice.spec`."""
    kubectl = str(binaries.find(("kubectl",)) / "kubectl")
    config = ["--kubeconfig", str(control_plane.kubeconfig_path)]
    listed = subprocess.run([kubectl, *config, "get", "gpudevices", "-A"], capture_output=True, text=True, check=True)
    assert "error" not in listed.stderr.lower()
    explained = subprocess.run(
        [kubectl, *config, "explain", "gpudevice.spec"], capture_output=True, text=True, check=True
    ).stdout
    assert "className" in explained
    assert "count" in explained
