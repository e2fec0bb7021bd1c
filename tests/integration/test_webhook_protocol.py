"""The webhook as the API server talks to it: reinvocation, undecodable bodies, registration."""

from __future__ import annotations

import base64
import json
import tempfile
import uuid
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import requests

from cozygpu.api import kinds
from cozygpu.devcluster.harness import OperatorProcess
from cozygpu.kube.adapter import Kube
from tests.conftest import Gpu, GPUNodeFactory
from tests.denier import RELABEL_LABEL, labelling_webhook
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


def test_the_api_server_reinvokes_us_after_a_later_webhook_changes_the_vmi(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory, tmp_path: Path
) -> None:
    """§3 with reinvocationPolicy IfNeeded: called twice, one bind, the stored VMI carries our patch once."""
    gpu_node({gpu.resource: 2}, name=f"inv-{gpu.cls}")
    refs = [{"deviceTemplate": {"className": gpu.cls, "count": 1}}]
    before = len(admitting.events("vmi.admitted"))
    with labelling_webhook(kube, tmp_path):
        stored = kube.create(kinds.VMI, vmi_body("reinvoked", namespace, refs, labels={RELABEL_LABEL: "true"}))
    assert stored["metadata"]["labels"]["test.cozy/relabelled"] == "yes"
    assert stored["spec"]["domain"]["devices"]["gpus"] == [{"name": "gpudev0-0", "deviceName": gpu.resource}]
    [term] = stored["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": [f"inv-{gpu.cls}"]}]
    calls = [e for e in admitting.events("vmi.admitted")[before:] if e["vmi"] == "reinvoked"]
    assert len(calls) == 2
    binds = [e for e in admitting.events("bind.answered") if e["vmi"] == "reinvoked"]
    assert len(binds) == 1
