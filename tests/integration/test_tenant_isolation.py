"""Tenants are untrusted (§14): what a tenant with the chart's tenant role and KubeVirt's VMI rights tries.

Each test is a move a hostile tenant can make through the real API server; each ends refused
or harmless, and fails on the code before its fix (issue 19).
"""

from __future__ import annotations

import base64
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests

from cozygpu.api import kinds
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.devcluster.harness import OperatorProcess
from cozygpu.kube.adapter import ApiError, Kube
from tests.conftest import Gpu, GPUNodeFactory
from tests.helpers import device_status, held, vmi_body

pytestmark = pytest.mark.integration


def tenant(plane: ControlPlane, kube: Kube, namespace: str, directory: Path) -> Kube:
    """A user with the chart's cozy-gpu-tenant-edit role and create/get/delete of VMIs, in `namespace` only."""
    user = "mallory"
    rbac = "rbac.authorization.k8s.io/v1"
    rule = {"apiGroups": ["kubevirt.io"], "resources": ["virtualmachineinstances"],
            "verbs": ["create", "get", "list", "delete"]}  # fmt: skip
    meta = {"name": "vmis", "namespace": namespace}
    kube.create(kinds.kind("Role"), {"apiVersion": rbac, "kind": "Role", "metadata": meta, "rules": [rule]})
    for role, kind in (("cozy-gpu-tenant-edit", "ClusterRole"), ("vmis", "Role")):
        kube.create(kinds.kind("RoleBinding"), {"apiVersion": rbac, "kind": "RoleBinding",
                    "metadata": {"name": role, "namespace": namespace},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})  # fmt: skip
    return Kube.from_kubeconfig(plane.write_kubeconfig(directory / user, user=user, group=None))


def test_a_second_create_of_a_running_vmis_name_writes_nothing(
    admitting: OperatorProcess,
    control_plane: ControlPlane,
    kube: Kube,
    namespace: str,
    gpu: Gpu,
    gpu_node: GPUNodeFactory,
    tmp_path: Path,
) -> None:
    """§14.2: while `v` runs with `d1`, a create of `v` naming `d1` and `d2` is refused before any write: `d2` is
    not attached to the running VMI, and `d1` keeps its request and node (the API server's AlreadyExists comes
    only after admission, too late to undo what the webhook wrote)."""
    gpu_node({gpu.resource: 2}, name=f"one-{gpu.cls}")
    gpu_node({gpu.resource: 2}, name=f"two-{gpu.cls}")
    mallory = tenant(control_plane, kube, namespace, tmp_path)
    held(mallory, namespace, "d1", gpu.cls)
    mallory.create(kinds.VMI, vmi_body("v", namespace, [{"device": "d1"}]))
    held(mallory, namespace, "d2", gpu.cls)
    d1 = mallory.get(kinds.GPU_DEVICE, "d1", namespace)
    with pytest.raises(ApiError) as raised:
        mallory.create(kinds.VMI, vmi_body("v", namespace, [{"device": "d1"}, {"device": "d2"}]))
    assert raised.value.status == 403, raised.value.message
    assert f"VMI v already exists in namespace {namespace}" in raised.value.message
    assert "attachedTo" not in device_status(mallory, namespace, "d2")
    assert (
        mallory.get(kinds.GPU_DEVICE, "d1", namespace)["metadata"]["resourceVersion"]
        == d1["metadata"]["resourceVersion"]
    )


def test_a_vmi_name_too_long_for_its_gpu_devices_is_a_denial_not_an_error(
    admitting: OperatorProcess,
    control_plane: ControlPlane,
    kube: Kube,
    namespace: str,
    gpu: Gpu,
    gpu_node: GPUNodeFactory,
    tmp_path: Path,
) -> None:
    """A name whose `<vmi>-gpu-<i>` is no valid object name is refused naming the entry, not answered 500 (the API
    server checks the VMI's own name only after the mutating webhooks)."""
    gpu_node({gpu.resource: 1}, name=f"long-{gpu.cls}")
    mallory = tenant(control_plane, kube, namespace, tmp_path)
    name = "v" * 250
    with pytest.raises(ApiError) as raised:
        mallory.create(kinds.VMI, vmi_body(name, namespace, [{"deviceTemplate": {"className": gpu.cls, "count": 1}}]))
    assert raised.value.status == 403, raised.value.message
    assert 'admission webhook "vmi.gpu.cozystack.io" denied the request' in raised.value.message
    assert "made from the VMI's name is not a valid object name" in raised.value.message
    assert mallory.list(kinds.GPU_DEVICE, namespace) == []


def test_only_the_api_server_drives_the_webhooks(
    admitting: OperatorProcess,
    control_plane: ControlPlane,
    kube: Kube,
    namespace: str,
    gpu: Gpu,
    gpu_node: GPUNodeFactory,
    tmp_path: Path,
) -> None:
    """§14.1: a review posted straight to the VMI webhook, as any pod that reaches the port could, for a VMI `ghost`
    naming another tenant's stopped held device, gets no answer: without the client certificate the API server
    presents, the TLS handshake turns it away, and the device stays unattached. A caller with a certificate of
    the API server's webhook client CA is answered (a dry run here, so nothing is written)."""
    gpu_node({gpu.resource: 1}, name=f"ghost-{gpu.cls}")
    held(kube, namespace, "d1", gpu.cls)
    hooks = kube.get(kinds.MUTATING_WEBHOOKS, "cozy-gpu-operator")["webhooks"]
    [config] = [h["clientConfig"] for h in hooks if h["clientConfig"]["url"].endswith("/vmi")]
    url, ca = config["url"], tmp_path / "serving-ca.crt"
    ca.write_bytes(base64.b64decode(config["caBundle"]))
    vmi = vmi_body("ghost", namespace, [{"device": "d1"}])

    def review(dry_run: bool) -> dict[str, Any]:
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": str(uuid.uuid4()), "operation": "CREATE", "namespace": namespace, "name": "ghost",
            "kind": {"group": "kubevirt.io", "version": "v1", "kind": "VirtualMachineInstance"},
            "resource": {"group": "kubevirt.io", "version": "v1", "resource": "virtualmachineinstances"},
            "userInfo": {"username": "mallory"}, "object": vmi, "oldObject": None, "dryRun": dry_run}}  # fmt: skip

    with pytest.raises(requests.exceptions.ConnectionError):
        requests.post(url, json=review(False), verify=str(ca), timeout=10)
    assert "attachedTo" not in device_status(kube, namespace, "d1")
    client = control_plane.webhook_ca.client("someone-with-the-ca")
    (tmp_path / "c.crt").write_bytes(client.cert_pem)
    (tmp_path / "c.key").write_bytes(client.key_pem)
    answer = requests.post(url, json=review(True), verify=str(ca), timeout=10,
                           cert=(str(tmp_path / "c.crt"), str(tmp_path / "c.key")))  # fmt: skip
    assert answer.status_code == 200 and answer.json()["response"]["allowed"] is True
    assert "attachedTo" not in device_status(kube, namespace, "d1")
