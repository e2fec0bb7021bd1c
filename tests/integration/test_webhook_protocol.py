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
from cozygpu.kube.adapter import Kube
from cozygpu.runtime.admission import webhooks
from tests.support.bodies import vmi_body
from tests.support.harness import OperatorProcess
from tests.support.nodes import Gpu, GPUNodeFactory
from tests.support.webhooks import RELABEL_LABEL, labelling_webhook

pytestmark = pytest.mark.integration

# The client certificate the API server presents to webhooks (§14.1): these tests post as the API server does.
_AS_API_SERVER: list[tuple[str, str]] = []


@pytest.fixture(autouse=True)
def as_the_api_server(api_server_cert: tuple[str, str]) -> None:
    _AS_API_SERVER[:] = [api_server_cert]


def _cert() -> tuple[str, str]:
    return _AS_API_SERVER[0]


# The CA files _hook writes, removed with the module (they were left in /tmp, one per call).
_CA_DIR = tempfile.TemporaryDirectory(prefix="cozygpu-test-ca-")


def _hook(kube: Kube) -> tuple[str, str]:
    """The VMI webhook's URL and a CA file, read from the registered configuration."""
    config = kube.get(kinds.MUTATING_WEBHOOKS, webhooks.MUTATING_NAME)
    client = config["webhooks"][0]["clientConfig"]
    with tempfile.NamedTemporaryFile("wb", suffix=".crt", dir=_CA_DIR.name, delete=False) as ca:  # read by requests
        ca.write(base64.b64decode(client["caBundle"]))
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
    first = requests.post(url, json=_review(body, namespace), verify=ca, cert=_cert(), timeout=30).json()
    assert first["response"]["allowed"], first
    patch = _patch_of(first)
    assert patch
    request_id = kube.get(kinds.GPU_DEVICE, "vm-gpu-0", namespace)["status"]["bindRequest"]["id"]

    patched = jsonpatch.apply_patch(body, patch)
    again = requests.post(url, json=_review(patched, namespace), verify=ca, cert=_cert(), timeout=30).json()
    assert again["response"]["allowed"], again
    assert _patch_of(again) == []
    assert kube.get(kinds.GPU_DEVICE, "vm-gpu-0", namespace)["status"]["bindRequest"]["id"] == request_id
    # A later webhook may have dropped our entries: they come back, still without a new bind.
    third = requests.post(url, json=_review(body, namespace), verify=ca, cert=_cert(), timeout=30).json()
    assert third["response"]["allowed"]
    assert jsonpatch.apply_patch(body, _patch_of(third)) == patched
    assert kube.get(kinds.GPU_DEVICE, "vm-gpu-0", namespace)["status"]["bindRequest"]["id"] == request_id


@pytest.mark.parametrize("body", [b"{not json", b"{}", b'{"request": 3}', b"[]"])
def test_an_undecodable_body_is_a_400_not_a_denial(admitting: OperatorProcess, kube: Kube, body: bytes) -> None:
    """§3: a request the webhook cannot decode as an AdmissionReview is an error (HTTP 400)."""
    url, ca = _hook(kube)
    answer = requests.post(url, data=body, verify=ca, cert=_cert(), timeout=10)
    assert answer.status_code == 400


def test_the_webhook_serves_tls_the_api_server_can_verify(admitting: OperatorProcess, kube: Kube) -> None:
    """The caBundle in the configuration verifies the serving certificate; an unknown CA does not."""
    url, ca = _hook(kube)
    assert requests.post(url, data=b"{}", verify=ca, cert=_cert(), timeout=10).status_code == 400
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


def _post(url: str, ca: str, review: Any = None, *, data: bytes | None = None) -> requests.Response:
    return requests.post(url, json=review, data=data, verify=ca, cert=_cert(), timeout=30)


def test_a_path_no_hook_serves_is_a_404_not_an_allowed_answer(admitting: OperatorProcess, kube: Kube) -> None:
    """Issue 12: a mistyped webhook path in a configuration must not let everything through."""
    url, ca = _hook(kube)
    body = _review(vmi_body("vm", "t1", None), "t1")
    answer = _post(url.rsplit("/", 1)[0] + "/nope", ca, body)
    assert answer.status_code == 404


@pytest.mark.parametrize(
    ("spoil", "field"),
    [
        (lambda r: r["request"].pop("uid"), "request.uid"),
        (lambda r: r["request"].update(dryRun="yes"), "request.dryRun"),
        (lambda r: r["request"].update(object="a string"), "request.object"),
        (lambda r: r["request"]["object"].update(metadata=["a", "list"]), "request.object.metadata"),
        (lambda r: r["request"].update(userInfo=None), "request.userInfo"),
    ],
)
def test_a_wrongly_typed_review_is_a_400_naming_the_field(
    admitting: OperatorProcess, kube: Kube, spoil: Any, field: str
) -> None:
    """Issue 12: what is not a well-formed review is the caller's error (400, the field named), not a 500 with
    Python's words, nor an answer."""
    url, ca = _hook(kube)
    review = _review(vmi_body("vm", "t1", None), "t1")
    spoil(review)
    answer = _post(url, ca, review)
    assert answer.status_code == 400 and field in answer.reason


def test_deeply_nested_json_is_a_400(admitting: OperatorProcess, kube: Kube) -> None:
    """Issue 12: a body too deep for the decoder is undecodable (400), not a 500."""
    url, ca = _hook(kube)
    assert _post(url, ca, data=b"[" * 100_000 + b"]" * 100_000).status_code == 400


def test_a_review_as_large_as_etcd_allows_is_read(admitting: OperatorProcess, kube: Kube) -> None:
    """Issue 12: a VMI up to etcd's 1.5 MiB is legal; its review is read and answered (here: judged for its
    missing device annotation), not refused with 413."""
    url, ca = _hook(kube)
    vmi = vmi_body("large", "t1", None)
    vmi["metadata"]["annotations"] = {"example.com/blob": "x" * (1_400 * 1024)}
    review = _review(vmi, "t1")
    answer = _post(url, ca, review)
    assert answer.status_code == 200
    response = answer.json()["response"]
    assert response["uid"] == review["request"]["uid"] and "annotation" in response["status"]["message"]
