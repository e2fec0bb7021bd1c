"""Issue 19 item 1 (§14.1): only the API server drives the webhooks.

The attacker is anything that reaches the webhook's address (any pod, without a NetworkPolicy):
it posts reviews of its own making straight to the port, for another tenant's namespace and
devices. Without the client certificate the API server presents, the TLS handshake turns it away;
a review whose request and object namespaces differ is refused even from a caller with it.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from cozygpu import tls
from cozygpu.api import hooks, kinds
from cozygpu.api.names import API_VERSION
from cozygpu.devcluster.bodies import vmi_body
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import Body, Kube
from cozygpu.runtime.admission import webhooks
from tests.support.bodies import budget_body, gpu_device_body
from tests.support.harness import OperatorProcess
from tests.support.invariants import assert_invariants
from tests.support.nodes import Gpu, GPUNodeFactory
from tests.support.objects import device_status, held
from tests.support.tenants import Tenant

pytestmark = [pytest.mark.integration, pytest.mark.adversarial]

HOOKS = {hook.id: (hook.kind.group, hook.kind.version, hook.kind.kind, hook.kind.plural) for hook in hooks.HOOKS}


@dataclass(frozen=True)
class Port:
    """The webhook server as the operator registered it: its base URL and the CA file of its serving cert."""

    base: str
    serving_ca: str

    def post(self, hook: str, review: Body, cert: tuple[str, str] | None = None) -> requests.Response:
        return requests.post(f"{self.base}/{hook}", json=review, verify=self.serving_ca, cert=cert, timeout=20)


@pytest.fixture
def port(admitting: OperatorProcess, kube: Kube, tmp_path: Path) -> Port:
    hooks = kube.get(kinds.MUTATING_WEBHOOKS, webhooks.MUTATING_NAME)["webhooks"]
    config = hooks[0]["clientConfig"]
    ca = tmp_path / "serving-ca.crt"
    ca.write_bytes(base64.b64decode(config["caBundle"]))
    return Port(config["url"].rsplit("/", 1)[0], str(ca))


@pytest.fixture
def own_cert(tmp_path: Path) -> tuple[str, str]:
    """A client certificate of a CA the attacker made itself, named as the API server's."""
    client = tls.Authority("mallory's CA").client("kube-apiserver-webhook-client")
    (tmp_path / "own.crt").write_bytes(client.cert_pem)
    (tmp_path / "own.key").write_bytes(client.key_pem)
    return str(tmp_path / "own.crt"), str(tmp_path / "own.key")


def review(hook: str, namespace: str, obj: Body, *, dry_run: bool = False, user: str = "mallory") -> Body:
    """An AdmissionReview of a CREATE as the API server would send it, for `obj` in `namespace`."""
    group, version, kind, resource = HOOKS[hook]
    gvk, gvr = (
        {"group": group, "version": version, "kind": kind},
        {"group": group, "version": version, "resource": resource},
    )
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "operation": "CREATE",
            "namespace": namespace,
            "name": obj["metadata"]["name"],
            "userInfo": {"username": user, "groups": ["system:authenticated"]},
            "object": obj,
            "oldObject": None,
            "dryRun": dry_run,
        },
    }


def forgeries(victim: Tenant, gpu: Gpu) -> dict[str, Body]:
    """Per hook, the object of a review that would act in the victim's namespace: a VMI `ghost` naming the
    victim's held device `d1` and a template entry, a launcher-like pod, a device order, a class and a budget."""
    ns = victim.namespace
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "ghost-launcher", "namespace": ns, "labels": {"kubevirt.io": "virt-launcher"}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {gpu.resource: "1"}}}]},
    }
    return {
        webhooks.VMI_HOOK: vmi_body(
            "ghost", ns, [{"device": "d1"}, {"deviceTemplate": {"className": gpu.cls, "count": 1}}]
        ),
        webhooks.POD_HOOK: pod,
        webhooks.DEVICE_HOOK: gpu_device_body("phantom", ns, gpu.cls, 2),
        webhooks.CLASS_HOOK: {
            "apiVersion": API_VERSION,
            "kind": "GPUClass",
            "metadata": {"name": "cls-ghost"},
            "spec": {"mode": "passthrough", "resourceName": gpu.resource},
        },
        webhooks.BUDGET_HOOK: {
            "apiVersion": API_VERSION,
            "kind": "GPUBudget",
            "metadata": {"name": "ghost", "namespace": ns},
            "spec": {"total": 100},
        },
    }


def untouched(kube: Kube, victim: Tenant) -> None:
    """Nothing the forgeries asked for happened in the victim's namespace: `d1` unattached, no device made."""
    assert "attachedTo" not in device_status(kube, victim.namespace, "d1")
    assert "bindRequest" not in device_status(kube, victim.namespace, "d1")
    assert sorted(d["metadata"]["name"] for d in kube.list(kinds.GPU_DEVICE, victim.namespace)) == ["d1", "d2"]


def test_a_review_without_the_api_servers_certificate_gets_no_answer_and_writes_nothing(
    admitting: OperatorProcess,
    control_plane: ControlPlane,
    kube: Kube,
    port: Port,
    own_cert: tuple[str, str],
    mallory: Tenant,
    victim: Tenant,
    gpu: Gpu,
    gpu_node: GPUNodeFactory,
    tmp_path: Path,
) -> None:
    """§14.1: reviews posted straight to every hook for the victim's namespace (a VMI `ghost` naming its stopped
    held device, a pod, a device order against its budget, a class, a budget), with no client certificate or
    with one of a CA of the caller's own, get no answer: the TLS handshake turns them away; the device stays
    unattached and nothing is reserved (the victim still orders its whole budget). A caller with a certificate
    of the API server's webhook client CA is answered (a dry run, so nothing is written)."""
    gpu_node({gpu.resource: 4}, name=f"ghost-{gpu.cls}")
    kube.create(kinds.GPU_BUDGET, budget_body(victim.namespace, total=2))
    held(victim.kube, victim.namespace, "d1", gpu.cls)
    for hook, obj in forgeries(victim, gpu).items():
        for cert in (None, own_cert):
            with pytest.raises(requests.exceptions.ConnectionError):
                port.post(hook, review(hook, victim.namespace, obj), cert)
    held(victim.kube, victim.namespace, "d2", gpu.cls)  # the rest of its budget: no phantom order holds it
    untouched(kube, victim)
    client = control_plane.webhook_ca.client("someone-with-the-ca")
    (tmp_path / "c.crt").write_bytes(client.cert_pem)
    (tmp_path / "c.key").write_bytes(client.key_pem)
    ghost = review(webhooks.VMI_HOOK, victim.namespace, forgeries(victim, gpu)[webhooks.VMI_HOOK], dry_run=True)
    answer = port.post(webhooks.VMI_HOOK, ghost, (str(tmp_path / "c.crt"), str(tmp_path / "c.key")))
    assert answer.status_code == 200 and answer.json()["response"]["uid"] == ghost["request"]["uid"]
    untouched(kube, victim)
    assert_invariants(kube, (mallory, victim), admitting)


def test_a_review_whose_namespaces_differ_is_refused_and_writes_nothing(
    admitting: OperatorProcess,
    kube: Kube,
    port: Port,
    api_server_cert: tuple[str, str],
    mallory: Tenant,
    victim: Tenant,
    gpu: Gpu,
    gpu_node: GPUNodeFactory,
) -> None:
    """§14.1: even from a caller with the API server's certificate, a review whose request names mallory's
    namespace while its object is in the victim's is a 400 for every hook: the victim's device is not
    attached to `ghost`, no template device is made there, no order is reserved against its budget."""
    gpu_node({gpu.resource: 4}, name=f"forged-{gpu.cls}")
    kube.create(kinds.GPU_BUDGET, budget_body(victim.namespace, total=2))
    held(victim.kube, victim.namespace, "d1", gpu.cls)
    for hook, obj in forgeries(victim, gpu).items():
        if hook == webhooks.CLASS_HOOK:
            continue  # cluster-scoped: no object namespace to disagree with
        answer = port.post(hook, review(hook, mallory.namespace, obj), api_server_cert)
        assert answer.status_code == 400, (hook, answer.status_code, answer.text)
        assert "namespace is not request.namespace" in answer.reason
    held(victim.kube, victim.namespace, "d2", gpu.cls)  # the rest of its budget: no phantom order holds it
    untouched(kube, victim)
    assert_invariants(kube, (mallory, victim), admitting)
