"""§3: when the API fails the webhook, a labelled VMI gets an error (HTTP 500), never an admission.

The operator runs as a user whose RBAC lets it do everything except `get` one kind,
so a fresh read fails the way an API outage would: before any write (GPUDevices), and
in the middle of a bind (VirtualMachineInstances), where what the call wrote is undone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from cozygpu.api import kinds
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.devcluster.harness import OperatorProcess, wait_for
from cozygpu.kube.adapter import ApiError, Body, Kube
from tests.conftest import Gpu, GPUNodeFactory
from tests.helpers import gpu_device_body, leftovers, vmi_body

pytestmark = pytest.mark.integration

USER = "cozy-gpu-no-get"
ROLE = "test-cozy-gpu-no-get"
READABLE = {
    "": ["nodes", "namespaces"],
    "gpu.cozystack.io": ["gpuclasses", "gpubudgets", "gpunodes", "gpudevices"],
    "kubevirt.io": ["kubevirts", "virtualmachineinstances"],
    "admissionregistration.k8s.io": [
        "mutatingwebhookconfigurations",
        "validatingwebhookconfigurations",
        "validatingadmissionpolicies",
        "validatingadmissionpolicybindings",
    ],
    "coordination.k8s.io": ["leases"],
}


def rules_without_get(unreadable: str) -> list[dict[str, object]]:
    """Everything the operator does, but `get` on one resource: RBAC is additive, so grant get one by one."""
    return [
        {"apiGroups": ["*"], "resources": ["*"], "verbs": ["list", "watch", "create", "update", "patch", "delete"]},
        *(
            {"apiGroups": [group], "resources": [r for r in resources if r != unreadable], "verbs": ["get"]}
            for group, resources in READABLE.items()
        ),
    ]


@contextmanager
def operator_unable_to_get(plane: ControlPlane, directory: Path, unreadable: str) -> Iterator[OperatorProcess]:
    """The operator with webhooks, as a user that cannot read single objects of one resource."""
    kube = plane.kube()
    rbac = "rbac.authorization.k8s.io"
    role = {"apiVersion": f"{rbac}/v1", "kind": "ClusterRole", "metadata": {"name": ROLE}}
    kube.create(kinds.kind("ClusterRole"), {**role, "rules": rules_without_get(unreadable)})
    kube.create(kinds.kind("ClusterRoleBinding"), {
        "apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": ROLE},
        "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": ROLE},
        "subjects": [{"apiGroup": rbac, "kind": "User", "name": USER}]})  # fmt: skip
    kubeconfig = plane.write_kubeconfig(directory / "kubeconfig", user=USER, group=None)
    process = OperatorProcess(kubeconfig, directory / "operator.log", "--dev", "--as-given", "--bind-timeout", "2")
    try:
        yield process.start()
    finally:
        process.stop()
        for kind in (kinds.MUTATING_WEBHOOKS, kinds.VALIDATING_WEBHOOKS):
            kube.delete(kind, "cozy-gpu-operator")
        kube.delete(kinds.kind("ClusterRoleBinding"), ROLE)
        kube.delete(kinds.kind("ClusterRole"), ROLE)


def accounted(kube: Kube, node: Body) -> None:
    """This operator is not one the node helpers know of: wait until its view has the node (its GPUNode)."""
    name = node["metadata"]["name"]
    wait_for(
        f"GPUNode {name}", lambda: (kube.get_or_none(kinds.GPU_NODE, name) or {}).get("status", {}).get("resources")
    )


def test_an_api_failure_is_an_error_and_the_vmi_is_not_created(
    control_plane: ControlPlane, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory, tmp_path: Path
) -> None:
    """The fresh read of §3.3 is forbidden: the answer is 500 with our message, no VMI is stored, we log it."""
    with operator_unable_to_get(control_plane, tmp_path, "gpudevices") as blind:
        accounted(kube, gpu_node({gpu.resource: 1}, name=f"blind-{gpu.cls}"))
        kube.create(kinds.GPU_DEVICE, gpu_device_body("h", namespace, gpu.cls))
        with pytest.raises(ApiError) as raised:
            kube.create(kinds.VMI, vmi_body("vm", namespace, [{"device": "h"}]))
        assert raised.value.status == 500, raised.value.message
        assert f"the GPU operator could not check the VMI: reading GPUDevice {namespace}/h" in raised.value.message
        assert kube.get_or_none(kinds.VMI, "vm", namespace) is None
        assert leftovers(kube, namespace, "vm") == []
        [error] = [e for e in blind.events("vmi.error") if e.get("namespace") == namespace]
        assert error["vmi"] == "vm"
        assert not [e for e in blind.events("vmi.refused") if e.get("namespace") == namespace]


def test_an_api_failure_in_the_middle_of_a_bind_undoes_the_calls_writes(
    control_plane: ControlPlane, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory, tmp_path: Path
) -> None:
    """The template device this call created is deleted, the running VMI's attachment untouched; the answer is 500."""
    with operator_unable_to_get(control_plane, tmp_path, "virtualmachineinstances"):
        accounted(kube, gpu_node({gpu.resource: 2}, name=f"half-{gpu.cls}"))
        kube.create(kinds.GPU_DEVICE, gpu_device_body("h", namespace, gpu.cls))
        wait_for("h bound", lambda: kube.get(kinds.GPU_DEVICE, "h", namespace).get("status", {}).get("phase"))
        running = kube.create(kinds.VMI, vmi_body("vm", namespace, [{"device": "h"}]))["metadata"]["uid"]

        def recorded() -> dict[str, str] | None:
            attachment: dict[str, str] = kube.get(kinds.GPU_DEVICE, "h", namespace)["status"]["attachedTo"]
            return attachment if attachment.get("uid") else None

        attached = wait_for("uid recorded", recorded)
        # The same name again: the template device is created, then checking who holds h fails.
        refs = [{"deviceTemplate": {"className": gpu.cls, "count": 1}}, {"device": "h"}]
        with pytest.raises(ApiError) as raised:
            kube.create(kinds.VMI, vmi_body("vm", namespace, refs))
        assert raised.value.status == 500, raised.value.message
        assert f"VirtualMachineInstance {namespace}/vm" in raised.value.message
        assert kube.get_or_none(kinds.GPU_DEVICE, "vm-gpu-0", namespace) is None
        assert kube.get(kinds.GPU_DEVICE, "h", namespace)["status"]["attachedTo"] == attached
        assert attached["uid"] == running
        kube.delete(kinds.VMI, "vm", namespace)
