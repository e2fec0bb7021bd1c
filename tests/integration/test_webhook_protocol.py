"""The webhook as the API server talks to it: reinvocation, undecodable bodies, registration."""

from __future__ import annotations

import base64
import json
import tempfile
import uuid
from typing import Any

import jsonpatch
import pytest
import requests

from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.devcluster.harness import OperatorProcess
from cozygpu.kube import kinds
from cozygpu.kube.adapter import Kube
from tests.conftest import Gpu, GPUNodeFactory, start_admitting_operator
from tests.helpers import vmi_body

pytestmark = pytest.mark.integration


def _hook(kube: Kube) -> tuple[str, str]:
    """The VMI webhook's URL and a CA file, read from the registered configuration."""
    config = kube.get(kinds.MUTATING_WEBHOOKS, "cozy-gpu-operator")
    client = config["webhooks"][0]["clientConfig"]
    ca = tempfile.NamedTemporaryFile("wb", suffix=".crt", delete=False)  # noqa: SIM115 - read by requests below
    ca.write(base64.b64decode(client["caBundle"]))
    ca.close()
    return client["url"], ca.name


def _review(vmi: dict[str, Any], namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "kubevirt.io", "version": "v1", "kind": "VirtualMachineInstance"},
            "resource": {"group": "kubevirt.io", "version": "v1", "resource": "virtualmachineinstances"},
            "requestKind": {"group": "kubevirt.io", "version": "v1", "kind": "VirtualMachineInstance"},
            "requestResource": {"group": "kubevirt.io", "version": "v1", "resource": "virtualmachineinstances"},
            "name": vmi["metadata"]["name"],
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "admin", "groups": ["system:masters"]},
            "object": vmi,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def _patch_of(answer: dict[str, Any]) -> list[dict[str, Any]]:
    encoded = answer["response"].get("patch")
    return json.loads(base64.b64decode(encoded)) if encoded else []


def test_a_reinvocation_neither_asks_the_binder_again_nor_patches_twice(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """§3: the API server calls again with our patch applied: allowed, no patch, the same bind request."""
    gpu_node({gpu.resource: 2}, name=f"re-{gpu.cls}")
    refs = [{"deviceTemplate": {"className": gpu.cls, "count": 2}}]
    body = vmi_body("vm", namespace, refs)
    # The first call, exactly as the API server makes it; the VMI is not stored yet, as within one create.
    url, ca = _hook(kube)
    first = requests.post(url, json=_review(body, namespace), verify=ca, timeout=30).json()
    assert first["response"]["allowed"], first
    patch = _patch_of(first)
    assert patch
    request_id = kube.get(kinds.GPU_DEVICE, "vm-gpu-0", namespace)["status"]["bindRequest"]["id"]

    patched = jsonpatch.apply_patch(body, patch)
    again = requests.post(url, json=_review(patched, namespace), verify=ca, timeout=30).json()
    assert again["response"]["allowed"], again
    assert _patch_of(again) == []
    assert kube.get(kinds.GPU_DEVICE, "vm-gpu-0", namespace)["status"]["bindRequest"]["id"] == request_id
    # A later webhook may have dropped our entries: they come back, still without a new bind.
    third = requests.post(url, json=_review(body, namespace), verify=ca, timeout=30).json()
    assert third["response"]["allowed"]
    assert jsonpatch.apply_patch(body, _patch_of(third)) == patched
    assert kube.get(kinds.GPU_DEVICE, "vm-gpu-0", namespace)["status"]["bindRequest"]["id"] == request_id


@pytest.mark.parametrize("body", [b"{not json", b"{}", b'{"request": 3}', b"[]"])
def test_an_undecodable_body_is_a_400_not_a_denial(admitting: OperatorProcess, kube: Kube, body: bytes) -> None:
    """§3: a request the webhook cannot decode as an AdmissionReview is an error (HTTP 400)."""
    url, ca = _hook(kube)
    answer = requests.post(url, data=body, verify=ca, timeout=10)
    assert answer.status_code == 400


def test_the_webhook_serves_tls_the_api_server_can_verify(admitting: OperatorProcess, kube: Kube) -> None:
    """The caBundle in the configuration verifies the serving certificate; an unknown CA does not."""
    url, ca = _hook(kube)
    assert requests.post(url, data=b"{}", verify=ca, timeout=10).status_code == 400
    with pytest.raises(requests.exceptions.SSLError):
        requests.post(url, data=b"{}", verify=True, timeout=10)


def test_configurations_follow_section_3_and_go_away_on_exit(
    control_plane: ControlPlane, kube: Kube, tmp_path: Any
) -> None:
    """Registered before /readyz says ok, with §3's policies; removed when the operator stops."""
    operator = start_admitting_operator(control_plane, tmp_path, "--webhook-timeout", "20")
    try:
        assert operator.ready()
        mutating = kube.get(kinds.MUTATING_WEBHOOKS, "cozy-gpu-operator")["webhooks"][0]
        assert mutating["objectSelector"] == {"matchLabels": {"gpu.cozystack.io/device-reference": "true"}}
        assert (mutating["reinvocationPolicy"], mutating["sideEffects"], mutating["failurePolicy"]) == (
            "IfNeeded", "NoneOnDryRun", "Fail")  # fmt: skip
        assert mutating["timeoutSeconds"] == 20
        assert mutating["rules"][0]["operations"] == ["CREATE"]
        validating = kube.get(kinds.VALIDATING_WEBHOOKS, "cozy-gpu-operator")["webhooks"]
        assert sorted(w["name"] for w in validating) == [
            "gpubudget.gpu.cozystack.io", "gpuclass.gpu.cozystack.io", "gpudevice.gpu.cozystack.io"]  # fmt: skip
    finally:
        operator.stop()
    assert kube.get_or_none(kinds.MUTATING_WEBHOOKS, "cozy-gpu-operator") is None
    assert kube.get_or_none(kinds.VALIDATING_WEBHOOKS, "cozy-gpu-operator") is None
