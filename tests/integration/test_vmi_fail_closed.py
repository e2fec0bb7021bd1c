"""§3: when the API fails the webhook, a labelled VMI gets an error (HTTP 500), never an admission.

The operator runs as a user whose RBAC lets it do everything except one thing, so a call
fails the way an API outage would: a fresh read before any write (`get` of GPUDevices),
and a status write in the middle of a bind (one device's), where what the call wrote is
undone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from cozygpu.api import kinds
from cozygpu.devcluster import identity, nodes
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import ApiError, Body, Kube
from cozygpu.runtime.admission import webhooks
from tests.support.bodies import gpu_device_body, vmi_body
from tests.support.harness import OperatorProcess, wait_for
from tests.support.nodes import Gpu, GPUNodeFactory
from tests.support.refusals import leftovers

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


def rules_with_status_writes_only_for(names: list[str]) -> list[dict[str, object]]:
    """The operator's own rules (the chart's, --dev's, the Lease's), but status writes of GPUDevices only for
    these names: RBAC is additive, so the chart's status rule is granted without GPUDevices, then by name."""
    rules: list[dict[str, object]] = []
    for rule in [*identity.operator_rules(), *identity.DEV_RULES, *identity.leader_election_rules()]:
        resources = [r for r in rule.get("resources", []) if r != "gpudevices/status"]
        if resources:
            rules.append({**rule, "resources": resources})
    rules.append(
        {
            "apiGroups": ["gpu.cozystack.io"],
            "resources": ["gpudevices/status"],
            "verbs": ["update"],
            "resourceNames": names,
        }
    )
    return rules


@contextmanager
def operator_with(plane: ControlPlane, directory: Path, rules: list[dict[str, object]]) -> Iterator[OperatorProcess]:
    """The operator with webhooks, as a user granted exactly these rules."""
    kube = plane.kube()
    rbac = "rbac.authorization.k8s.io"
    role = {"apiVersion": f"{rbac}/v1", "kind": "ClusterRole", "metadata": {"name": ROLE}}
    kube.create(kinds.kind("ClusterRole"), {**role, "rules": rules})
    kube.create(
        kinds.kind("ClusterRoleBinding"),
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": ROLE},
            "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": ROLE},
            "subjects": [{"apiGroup": rbac, "kind": "User", "name": USER}],
        },
    )
    kubeconfig = plane.write_kubeconfig(directory / "kubeconfig", user=USER, group=None)
    process = OperatorProcess(kubeconfig, directory / "operator.log", "--dev", "--as-given", "--bind-timeout", "2")
    try:
        yield process.start()
    finally:
        process.stop()
        kube.delete(kinds.MUTATING_WEBHOOKS, webhooks.MUTATING_NAME)
        kube.delete(kinds.VALIDATING_WEBHOOKS, webhooks.CONFIGURATION_NAME)
        kube.delete(kinds.kind("ClusterRoleBinding"), ROLE)
        kube.delete(kinds.kind("ClusterRole"), ROLE)


def operator_unable_to_get(plane: ControlPlane, directory: Path, unreadable: str) -> Any:
    """The operator with webhooks, as a user that cannot read single objects of one resource."""
    return operator_with(plane, directory, rules_without_get(unreadable))


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
    """The API refuses the status write of the template device this call created, after the held device's went
    through: the template device is deleted, the held device's attachment and request cleared; the answer is 500."""
    with operator_with(control_plane, tmp_path, rules_with_status_writes_only_for(["h"])):
        accounted(kube, gpu_node({gpu.resource: 2}, name=f"half-{gpu.cls}"))
        kube.create(kinds.GPU_DEVICE, gpu_device_body("h", namespace, gpu.cls))
        wait_for(
            "h bound", lambda: kube.get(kinds.GPU_DEVICE, "h", namespace).get("status", {}).get("phase") == "Bound"
        )
        refs = [{"deviceTemplate": {"className": gpu.cls, "count": 1}}, {"device": "h"}]
        with pytest.raises(ApiError) as raised:
            kube.create(kinds.VMI, vmi_body("vm", namespace, refs))
        assert raised.value.status == 500, raised.value.message
        assert f"GPUDevice {namespace}/vm-gpu-0" in raised.value.message
        assert kube.get_or_none(kinds.GPU_DEVICE, "vm-gpu-0", namespace) is None
        status = kube.get(kinds.GPU_DEVICE, "h", namespace)["status"]
        assert "attachedTo" not in status and "bindRequest" not in status
        assert status["phase"] == "Bound"


def test_a_waiting_write_the_api_refuses_loses_none_of_the_pass(
    control_plane: ControlPlane, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory, tmp_path: Path
) -> None:
    """A node turns Ready and the binder decides both of its class's waiting devices in one pass, the older first;
    the API refuses the older one's waiting status: the younger one, which fits the new node, is Bound all the
    same (the pass went on, and lost nothing it had left)."""
    with operator_with(control_plane, tmp_path, rules_with_status_writes_only_for(["hold", "fits"])):
        accounted(kube, gpu_node({gpu.resource: 2}, name=f"full-{gpu.cls}"))
        late = gpu_node({gpu.resource: 1}, name=f"late-{gpu.cls}", ready=False)
        accounted(kube, late)
        kube.create(kinds.GPU_DEVICE, gpu_device_body("hold", namespace, gpu.cls, count=2))
        wait_for(
            "hold Bound",
            lambda: kube.get(kinds.GPU_DEVICE, "hold", namespace).get("status", {}).get("phase") == "Bound",
        )
        kube.create(kinds.GPU_DEVICE, gpu_device_body("big", namespace, gpu.cls, count=2))
        kube.create(kinds.GPU_DEVICE, gpu_device_body("fits", namespace, gpu.cls))
        wait_for(
            "fits Pending",
            lambda: kube.get(kinds.GPU_DEVICE, "fits", namespace).get("status", {}).get("phase") == "Pending",
        )
        nodes.set_ready(kube, late["metadata"]["name"], True)
        wait_for(
            "fits Bound",
            lambda: kube.get(kinds.GPU_DEVICE, "fits", namespace).get("status", {}).get("phase") == "Bound",
            timeout=20,
        )
        assert "phase" not in kube.get(kinds.GPU_DEVICE, "big", namespace).get("status", {})
