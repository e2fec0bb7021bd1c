"""The Helm chart (§10): rendered by a real helm, checked against the operator's own code and the API server.

helm is built from the Go module proxy like the control plane (`hack/build-control-plane.sh helm`). The
chart's webhook configurations must be the ones the operator registers itself in --dev mode, its
ClusterRole the one every integration test runs the operator with, and every object it renders must be
accepted by the real API server. The image itself is built and run with the chart's settings in tests/image.

The NetworkPolicy (§14.1) is checked for what it says and that the API server accepts it; whether packets are
dropped depends on a CNI that enforces NetworkPolicy, and this machine runs none (no Docker, no kind, no kubelet
networking: the API server here stores the policy and nothing enforces it). tests/e2e/test_kind.py checks
enforcement where kind runs.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from cozygpu import tls
from cozygpu.api import kinds
from cozygpu.devcluster import binaries, identity
from cozygpu.kube.adapter import Kube
from cozygpu.ports import free_port
from cozygpu.runtime.admission import policy, webhooks
from cozygpu.settings import Settings
from tests.support.harness import OperatorProcess

pytestmark = pytest.mark.integration

CHART = binaries.repo_root() / "charts" / "cozy-gpu-operator"
RELEASE, NAMESPACE = identity.NAME, identity.NAMESPACE  # the chart's defaults are the dev identity's names
# The chart renders only once something admits the API server to the webhook port (§14.1): an address from
# TEST-NET-1 (RFC 5737) unless a test says otherwise.
API_SERVER = ("--set", "networkPolicy.apiServer.cidrs={192.0.2.10/32}")


@pytest.fixture(scope="module")
def helm() -> Path:
    return binaries.find(("helm",)) / "helm"


def run(helm: Path, *args: str) -> str:
    done = subprocess.run([str(helm), *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def render(
    helm: Path, *args: str, release: str = RELEASE, namespace: str = NAMESPACE, fence: tuple[str, ...] = API_SERVER
) -> list[dict[str, Any]]:
    out = run(helm, "template", release, str(CHART), "--namespace", namespace, *fence, *args)
    return [d for d in yaml.safe_load_all(out) if d]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    [found] = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return found


def without_client(config: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted(
        ({k: v for k, v in w.items() if k != "clientConfig"} for w in config["webhooks"]), key=lambda w: w["name"]
    )


def test_the_no_bypass_policies_are_the_ones_the_operator_registers_itself(helm: Path) -> None:
    """§12.3: the chart's ValidatingAdmissionPolicies and bindings equal the code's, with the chart's controller
    user, its own mutating configuration as the second's parameter, and exempt namespaces (passed to the operator
    too); turned off by a value."""
    user = "system:serviceaccount:virt:controller"
    docs = render(helm, "--set", f"kubevirt.controllerUser={user}")
    policies = {policy.NAME: policy.policy(user), policy.WEBHOOKS_NAME: policy.webhooks_policy()}
    for name, built in policies.items():
        assert one(docs, "ValidatingAdmissionPolicy", name)["spec"] == built["spec"]
    # The second policy finds the chart's mutating configuration by the label the operator's own carries.
    labels = one(docs, "MutatingWebhookConfiguration")["metadata"]["labels"]
    assert webhooks.configurations("https://x", b"", 10, "op")[0]["metadata"]["labels"].items() <= labels.items()
    exempt = render(helm, "--set", "noBypassPolicy.exemptNamespaces={lab,ci}")
    # The operator's own namespace is never exempt: its guard probes the policy there.
    own = render(helm, "--set", f"noBypassPolicy.exemptNamespaces={{{NAMESPACE}}}")
    for rendered, asked in ((docs, []), (exempt, ["ci", "lab"]), (own, [NAMESPACE])):
        namespaces = policy.exempt_of(NAMESPACE, asked)
        bindings = {
            policy.NAME: policy.binding(NAMESPACE, namespaces),
            policy.WEBHOOKS_NAME: policy.webhooks_binding(namespaces),
        }
        for name, built in bindings.items():
            assert one(rendered, "ValidatingAdmissionPolicyBinding", name)["spec"] == built["spec"]
    [container] = one(exempt, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert {"name": "COZYGPU_EXEMPT_NAMESPACES", "value": "lab,ci"} in container["env"]
    assert {"name": "COZYGPU_NO_BYPASS_POLICY", "value": "true"} in container["env"]
    off = render(helm, "--set", "noBypassPolicy.enabled=false")
    assert not [d for d in off if d["kind"].startswith("ValidatingAdmissionPolicy")]
    [container] = one(off, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert {"name": "COZYGPU_NO_BYPASS_POLICY", "value": "false"} in container["env"]


def test_the_chart_lints(helm: Path) -> None:
    """helm lint --strict finds nothing to say, the NetworkPolicy rendered (given the API server's addresses)."""
    run(helm, "lint", str(CHART), "--strict", *API_SERVER)


def test_the_webhooks_are_the_ones_the_operator_registers_itself(helm: Path) -> None:
    """Rules, selectors, policies, timeouts and matchConditions equal the code's; they point at the Service."""
    docs = render(helm)
    mutating, validating = one(docs, "MutatingWebhookConfiguration"), one(docs, "ValidatingWebhookConfiguration")
    ours = webhooks.configurations("https://unused", b"", 20, identity.USERNAME)
    assert without_client(mutating) == without_client(ours[0])
    assert without_client(validating) == without_client(ours[1])
    ca = one(docs, "Secret")["data"]["ca.crt"]
    for hook in mutating["webhooks"] + validating["webhooks"]:
        client = hook["clientConfig"]
        path = "/" + hook["name"].split(".")[0]
        assert client["service"] == {"name": RELEASE, "namespace": NAMESPACE, "path": path, "port": 443}
        assert client["caBundle"] == ca


def test_the_mutating_configuration_is_called_after_kubevirts(helm: Path) -> None:
    """The API server calls mutating configurations in name order: ours after virt-api's and the launcher pod
    mutator (KubeVirt's names), so it is not called a second time after virt-api changed the VMI."""
    docs = render(helm)
    mutating = one(docs, "MutatingWebhookConfiguration")["metadata"]["name"]
    assert mutating == f"zz-{RELEASE}" == webhooks.MUTATING_PREFIX + RELEASE
    assert sorted([mutating, "virt-api-mutator", "virt-launcher-pod-mutator"])[-1] == mutating
    assert one(docs, "ValidatingWebhookConfiguration")["metadata"]["name"] == RELEASE


def test_the_generated_certificate_serves_the_service_and_is_signed_by_the_bundle(helm: Path) -> None:
    """Without cert-manager: tls.crt names the Service's DNS names and chains to ca.crt."""
    secret = one(render(helm), "Secret")
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    leaf = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert f"{RELEASE}.{NAMESPACE}.svc" in names
    leaf.verify_directly_issued_by(ca)
    assert secret["type"] == "kubernetes.io/tls"


def test_with_cert_manager_the_ca_is_injected_and_no_secret_rendered(helm: Path) -> None:
    """cert-manager served: an Issuer and Certificate into the Secret the Deployment mounts; CA injected."""
    docs = render(helm, "--api-versions", "cert-manager.io/v1")
    assert not [d for d in docs if d["kind"] == "Secret"]
    certificate = one(docs, "Certificate")
    volumes = one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tls", "secret": {"secretName": certificate["spec"]["secretName"]}} in volumes
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        config = one(docs, kind)
        assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/{RELEASE}-webhook"
        assert all("caBundle" not in w["clientConfig"] for w in config["webhooks"])


def test_the_operator_role_is_the_one_the_tests_run_with(helm: Path) -> None:
    """The ClusterRole and tenants' roles are the files every integration test binds (§10)."""
    docs = render(helm)
    assert one(docs, "ClusterRole", RELEASE)["rules"] == identity.operator_rules()
    for role in identity.tenant_roles():
        rendered = one(docs, "ClusterRole", role["metadata"]["name"])
        assert rendered["rules"] == role["rules"]
        assert role["metadata"]["labels"].items() <= rendered["metadata"]["labels"].items()
    binding = one(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE, "namespace": NAMESPACE}]
    assert one(docs, "Role")["rules"] == identity.leader_election_rules()
    assert one(docs, "ClusterRole", f"{RELEASE}-metrics-reader")["rules"] == identity.metrics_reader_rules()


def test_values_reach_the_operator_as_settings_it_accepts(helm: Path) -> None:
    """The Deployment's environment is valid Settings; timeouts flow into both the operator and the webhooks."""
    docs = render(helm, "--set", "operator.bindTimeout=5", "--set", "operator.webhookTimeout=25")
    deployment = one(docs, "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    from_pod = {"COZYGPU_IDENTITY": "pod-name", "COZYGPU_LEASE_NAMESPACE": NAMESPACE}  # the downward API's
    assert {e["name"] for e in container["env"] if "valueFrom" in e} == set(from_pod)
    settings = Settings.load({**from_pod, **{e["name"]: e["value"] for e in container["env"] if "value" in e}}, {})
    assert (settings.bind_timeout, settings.webhook_timeout, settings.webhook_mode) == (5, 25, "cluster")
    assert settings.metrics_auth  # §14.4: on unless a value turns it off
    assert one(docs, "MutatingWebhookConfiguration")["webhooks"][0]["timeoutSeconds"] == 25
    assert {w["timeoutSeconds"] for w in one(docs, "ValidatingWebhookConfiguration")["webhooks"]} == {10}
    probes = {container["readinessProbe"]["httpGet"]["path"], container["livenessProbe"]["httpGet"]["path"]}
    assert probes == {"/readyz", "/healthz"}


def test_every_rendered_object_is_accepted_by_the_api_server(helm: Path, kube: Kube) -> None:
    """A server-side dry run of each object, as an install or upgrade would write it: all are accepted."""
    release = namespace = "chart-check"
    kube.put_object(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    docs = render(helm, release=release, namespace=namespace)
    expected = [
        "ServiceAccount",
        "Secret",
        "ClusterRole",
        "ClusterRole",
        "ClusterRole",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Service",
        "Deployment",
        "PodDisruptionBudget",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
        "NetworkPolicy",
    ]
    assert sorted(d["kind"] for d in docs) == sorted(expected)
    for doc in docs:
        kind = kinds.kind(doc["kind"])
        if kind.namespaced:
            assert doc["metadata"]["namespace"] == namespace
        existing = kube.get_or_none(kind, doc["metadata"]["name"], doc["metadata"].get("namespace"))
        if existing is None:
            kube.create(kind, doc, dry_run=True)
        else:  # the tenants' roles are cluster-wide: other tests installed them already
            doc["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
            kube.replace(kind, doc, dry_run=True)


# -- replicas (§10; issue 21 item 4): one active binder, admissions on every synced replica ----------------------------


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(docs, "Deployment")["spec"]["template"]["spec"]
    return spec


def test_two_replicas_by_default_upgraded_one_at_a_time(helm: Path) -> None:
    """Two replicas; an upgrade starts the new pod and waits for it to be ready (/readyz: view synced, webhook
    server listening) before it stops an old one, so one always serves admissions: not Recreate. A stopping pod
    sleeps in preStop while the endpoints drop it (no new connection reaches it, its kept ones still serve), then
    drains (every answer closes its connection), within a grace period that leaves an admission under way its
    webhook timeout after both (issue 33 item 4)."""
    docs = render(helm)
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    spec = pod_spec(docs)
    [container] = spec["containers"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    sleep = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    drain = float(env.get("COZYGPU_DRAIN_SECONDS") or Settings().drain_seconds)
    webhook_timeout = float(env["COZYGPU_WEBHOOK_TIMEOUT"])
    assert sleep > 0 and drain > 0 and spec["terminationGracePeriodSeconds"] >= sleep + drain + webhook_timeout
    assert [p["targetPort"] for p in one(docs, "Service")["spec"]["ports"] if p["name"] == "webhook"] == ["webhook"]
    assert one(docs, "Service")["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    single = render(helm, "--set", "replicas=1", "--set", "preStopSleepSeconds=0")
    assert one(single, "Deployment")["spec"]["replicas"] == 1
    assert "lifecycle" not in pod_spec(single)["containers"][0]


def test_each_replica_is_its_own_pod_in_the_lease(helm: Path) -> None:
    """COZYGPU_IDENTITY is the pod's name (the downward API), so replicas are distinct holders of one Lease, which
    lives in the pod's namespace under a name every replica shares."""
    [container] = pod_spec(render(helm, "--set", "replicas=3"))["containers"]
    from_pod = {e["name"]: e["valueFrom"] for e in container["env"] if "valueFrom" in e}
    assert from_pod == {
        "COZYGPU_IDENTITY": {"fieldRef": {"fieldPath": "metadata.name"}},
        "COZYGPU_LEASE_NAMESPACE": {"fieldRef": {"fieldPath": "metadata.namespace"}},
    }
    assert "COZYGPU_LEASE_NAME" not in {e["name"] for e in container["env"]}  # one Lease for all of them


def test_a_disruption_budget_takes_the_replicas_one_at_a_time(helm: Path) -> None:
    """With more than one replica a PodDisruptionBudget selects exactly the Deployment's pods and lets one go at a
    time (an unready one may always go: it serves nothing). One replica: none, which would block drains for
    good; also none when turned off."""
    docs = render(helm)
    budget, deployment = one(docs, "PodDisruptionBudget"), one(docs, "Deployment")
    assert budget["apiVersion"] == "policy/v1" and budget["metadata"]["name"] == RELEASE
    assert budget["spec"]["selector"] == deployment["spec"]["selector"]
    assert (
        budget["spec"]["selector"]["matchLabels"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    assert budget["spec"]["maxUnavailable"] == 1 and "minAvailable" not in budget["spec"]
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert one(render(helm, "--set", "replicas=3"), "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    for values in (("--set", "replicas=1"), ("--set", "podDisruptionBudget.enabled=false")):
        assert "PodDisruptionBudget" not in {d["kind"] for d in render(helm, *values)}


def test_replicas_spread_across_nodes_where_they_can(helm: Path) -> None:
    """A soft spread on the node name, counting the operator's pods of one revision: a one-node cluster still
    schedules every replica. The list is replaced by a value (a constraint's own labelSelector kept), [] removes
    it, and `affinity` passes through."""
    spec = pod_spec(render(helm))
    selector = one(render(helm), "Deployment")["spec"]["selector"]
    assert spec["topologySpreadConstraints"] == [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": selector,
            "matchLabelKeys": ["pod-template-hash"],
        }
    ]
    zone = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule"}
    own = {**zone, "labelSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["x"]}]}}
    no_gpu = {"weight": 1, "preference": {"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}}
    affinity = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [no_gpu]}}
    spec = pod_spec(
        render(
            helm,
            "--set-json",
            f"topologySpreadConstraints={json.dumps([zone, own])}",
            "--set-json",
            f"affinity={json.dumps(affinity)}",
        )
    )
    assert spec["topologySpreadConstraints"] == [{**zone, "labelSelector": selector}, own]
    assert spec["affinity"] == affinity
    assert "topologySpreadConstraints" not in pod_spec(render(helm, "--set-json", "topologySpreadConstraints=[]"))


def test_the_replica_settings_are_accepted_by_the_api_server(helm: Path, kube: Kube) -> None:
    """Server-side dry runs of the Deployment and budget in other forms than the defaults (which the test above
    writes): three replicas with a zone spread and affinity; one replica, no preStop sleep."""
    namespace = "chart-replicas-check"
    kube.put_object(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    zone = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"}
    apart = {
        "topologyKey": "kubernetes.io/hostname",
        "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": namespace}},
    }
    affinity = {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": apart}]
        }
    }
    forms = [
        (
            "--set",
            "replicas=3",
            "--set-json",
            f"topologySpreadConstraints={json.dumps([zone])}",
            "--set-json",
            f"affinity={json.dumps(affinity)}",
        ),
        ("--set", "replicas=1", "--set", "preStopSleepSeconds=0"),
    ]
    for values in forms:
        docs = render(helm, *values, release=namespace, namespace=namespace)
        for doc in docs:
            if doc["kind"] in ("Deployment", "PodDisruptionBudget"):
                stored = kube.create(kinds.kind(doc["kind"]), doc, dry_run=True)
                assert stored["spec"]["selector"] == doc["spec"]["selector"]
                if doc["kind"] == "Deployment":
                    assert stored["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
                    assert stored["spec"]["replicas"] == doc["spec"]["replicas"]


def _gpudevice_review(namespace: str, class_name: str) -> bytes:
    device = {
        "apiVersion": "gpu.cozystack.io/v1alpha1",
        "kind": "GPUDevice",
        "metadata": {"name": "d", "namespace": namespace},
        "spec": {"className": class_name, "count": 1},
    }
    resource = {"group": "gpu.cozystack.io", "version": "v1alpha1", "resource": "gpudevices"}
    kind = {"group": "gpu.cozystack.io", "version": "v1alpha1", "kind": "GPUDevice"}
    request = {
        "uid": str(uuid.uuid4()),
        "kind": kind,
        "resource": resource,
        "requestKind": kind,
        "requestResource": resource,
        "name": "d",
        "namespace": namespace,
        "operation": "CREATE",
        "userInfo": {"username": "tenant"},
        "object": device,
        "oldObject": None,
        "dryRun": True,
    }
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode()


def test_the_operator_serves_the_charts_certificate_in_cluster_mode(
    helm: Path, operator_kubeconfig: Path, tmp_path: Path
) -> None:
    """`cozygpu run` as the Deployment runs it: the chart's certificate, verified for the Service's name, answers."""
    secret = one(render(helm), "Secret")
    certs = tmp_path / "tls"
    certs.mkdir()
    for name in ("tls.crt", "tls.key"):
        (certs / name).write_bytes(base64.b64decode(secret["data"][name]))
    port = free_port()
    operator = OperatorProcess(
        operator_kubeconfig, tmp_path / "operator.log", "--webhook-port", str(port), "--webhook-cert-dir", str(certs)
    ).start()
    try:
        context = ssl.create_default_context(cadata=base64.b64decode(secret["data"]["ca.crt"]).decode())
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        # The API server dials the Service; the certificate must hold for that name, not for where it runs.
        conn = http.client.HTTPSConnection(f"{RELEASE}.{NAMESPACE}.svc", port, context=context)
        conn.sock = context.wrap_socket(raw, server_hostname=f"{RELEASE}.{NAMESPACE}.svc")
        conn.request(
            "POST", "/gpudevice", _gpudevice_review("t", "no-such-class"), {"Content-Type": "application/json"}
        )
        answer = json.loads(conn.getresponse().read())["response"]
        assert answer["allowed"] is False
        assert "GPUClass no-such-class does not exist" in answer["status"]["message"]
    finally:
        operator.stop()


def _sizing_table() -> list[dict[str, float]]:
    """docs/operating.md's Sizing table, as measured by bench/scale.py."""
    doc = (binaries.repo_root() / "docs" / "operating.md").read_text()
    section = doc.split("## Sizing", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split("|") for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    header, *body = [[cell.strip() for cell in row] for row in rows]
    return [{h: float(v) for h, v in zip(header, row, strict=True)} for row in body]


def _mib(quantity: str) -> int:
    assert quantity.endswith("Mi"), quantity
    return int(quantity[:-2])


def test_the_default_resources_fit_the_largest_measured_cloud(helm: Path) -> None:
    """Issue 13 item 3: the Deployment's memory request is what the operator holds after a resync at the largest
    size the docs measured (rounded up to 32 MiB), and its limit twice the peak there (rounded up to 64 MiB)."""
    largest = max(_sizing_table(), key=lambda row: row["devices"])
    [container] = one(render(helm), "Deployment")["spec"]["template"]["spec"]["containers"]
    resources = container["resources"]
    assert _mib(resources["requests"]["memory"]) == -(-largest["after a resync (MiB)"] // 32) * 32
    assert _mib(resources["limits"]["memory"]) == -(-2 * largest["peak (MiB)"] // 64) * 64
    assert largest["devices"] >= 50_000 and largest["nodes"] >= 5_000  # the size §13.3 promises


def test_a_webhook_client_ca_value_makes_the_operator_require_it(helm: Path) -> None:
    """§14.1: `webhookClientCA` renders a ConfigMap mounted where COZYGPU_WEBHOOK_CLIENT_CA points, so the webhook
    port requires the API server's client certificate; without the value nothing of it is rendered."""
    pem = tls.Authority("an API server's webhook client CA").cert_pem.decode()
    docs = render(helm, "--set-string", f"webhookClientCA={pem}")
    config = one(docs, "ConfigMap", f"{RELEASE}-webhook-client-ca")
    assert config["data"]["ca.crt"] == pem
    [container] = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "client-ca"]
    assert env["COZYGPU_WEBHOOK_CLIENT_CA"] == f"{mount['mountPath']}/ca.crt"
    volumes = one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "client-ca", "configMap": {"name": config["metadata"]["name"]}} in volumes
    plain = render(helm)
    assert not [d for d in plain if d["kind"] == "ConfigMap"]
    [container] = one(plain, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "COZYGPU_WEBHOOK_CLIENT_CA" not in {e["name"] for e in container["env"]}


# -- the NetworkPolicy (§14.1; issue 19 item 1, issue 23 item 3) -----------------------------------------------------

KONNECTIVITY = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
    "podSelector": {"matchLabels": {"k8s-app": "konnectivity-agent"}},
}


def container_ports(docs: list[dict[str, Any]]) -> dict[str, int]:
    """The operator container's ports by name, as the Deployment declares them."""
    [container] = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return {p["name"]: p["containerPort"] for p in container["ports"]}


def rules_by_port(policy: dict[str, Any]) -> dict[int, list[dict[str, Any]] | None]:
    """Each ingress rule's peers by the one port it opens; None where it admits every source."""
    found: dict[int, list[dict[str, Any]] | None] = {}
    for rule in policy["spec"]["ingress"]:
        [port] = rule["ports"]
        assert port.get("protocol", "TCP") == "TCP" and port["port"] not in found, rule
        found[port["port"]] = rule.get("from")
    return found


def test_the_network_policy_admits_the_api_server_to_the_webhook_and_monitoring_to_metrics(helm: Path) -> None:
    """§14.1: the policy selects the Deployment's pods, fences ingress only, and admits the webhook port (the one
    the Deployment names `webhook`, which the Service's webhook port and the operator's COZYGPU_WEBHOOK_PORT lead
    to) from the API server's CIDRs and peers, and the http port (metrics; the probes' port) from the monitoring
    namespace, narrowed by a pod selector when one is given. Every container port has a rule."""
    prometheus = {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}
    docs = render(
        helm,
        "--set",
        "networkPolicy.apiServer.cidrs={10.0.0.2/32,10.0.0.3/32}",
        "--set-json",
        f"networkPolicy.apiServer.peers={json.dumps([KONNECTIVITY])}",
        "--set-json",
        f"networkPolicy.metrics.podSelector={json.dumps(prometheus)}",
    )
    policy, deployment = one(docs, "NetworkPolicy"), one(docs, "Deployment")
    assert policy["metadata"]["name"] == RELEASE
    assert policy["spec"]["podSelector"] == deployment["spec"]["selector"]
    assert (
        policy["spec"]["podSelector"]["matchLabels"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    assert policy["spec"]["policyTypes"] == ["Ingress"] and "egress" not in policy["spec"]
    ports = container_ports(docs)
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert int(env["COZYGPU_WEBHOOK_PORT"]) == ports["webhook"] and int(env["COZYGPU_HEALTH_PORT"]) == ports["http"]
    service = {p["name"]: p["targetPort"] for p in one(docs, "Service")["spec"]["ports"]}
    assert service == {"webhook": "webhook", "http": "http"}  # by name: the policy sees the pod's port
    assert {container[p]["httpGet"]["port"] for p in ("readinessProbe", "livenessProbe")} == {"http"}
    rules = rules_by_port(policy)
    assert set(rules) == set(ports.values())
    assert rules[ports["webhook"]] == [
        {"ipBlock": {"cidr": "10.0.0.2/32"}},
        {"ipBlock": {"cidr": "10.0.0.3/32"}},
        KONNECTIVITY,
    ]
    monitoring = {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    assert rules[ports["http"]] == [{"namespaceSelector": monitoring, "podSelector": prometheus}]
    # The default: the whole monitoring namespace.
    assert rules_by_port(one(render(helm), "NetworkPolicy"))[ports["http"]] == [{"namespaceSelector": monitoring}]


def test_without_the_api_servers_addresses_or_a_client_ca_the_chart_refuses_to_render(helm: Path) -> None:
    """§14.1: with the policy on, no address or peer for the API server and no client CA, a policy would admit
    nobody to the webhook port and every GPU VMI would be refused (the webhooks fail closed), discovered only
    when VMs fail to start: `helm template` (and so install and upgrade) fails instead, saying what to set (`helm
    lint` logs a template's `fail` and passes: lint runs without the install's values). With a client CA
    and no addresses the webhook port is open to all (the TLS handshake is the fence) while metrics stay fenced;
    with the policy off nothing of it renders."""
    done = subprocess.run(
        [str(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0, done.stdout
    assert "nothing admits the API server to the webhook port" in done.stderr
    for value in (
        "networkPolicy.apiServer.cidrs",
        "networkPolicy.apiServer.peers",
        "webhookClientCA",
        "networkPolicy.enabled=false",
    ):
        assert value in done.stderr
    pem = tls.Authority("an API server's webhook client CA").cert_pem.decode()
    docs = render(helm, "--set-string", f"webhookClientCA={pem}", fence=())
    ports = container_ports(docs)
    rules = rules_by_port(one(docs, "NetworkPolicy"))
    assert rules[ports["webhook"]] is None
    assert rules[ports["http"]] is not None
    for fence in ((), API_SERVER):  # off: the platform fences the port itself, or nothing does (docs/security.md)
        off = render(helm, "--set", "networkPolicy.enabled=false", fence=fence)
        assert "NetworkPolicy" not in {d["kind"] for d in off}


def test_the_network_policy_is_accepted_by_the_api_server(helm: Path, kube: Kube) -> None:
    """Server-side dry runs: the API server's validation accepts each form the policy takes (addresses and peers
    with a narrowed metrics peer; a client CA alone, the webhook port open; metrics selectors emptied, the http
    port's rule gone). That the CNI enforces it cannot be shown here: no CNI runs (tests/e2e/test_kind.py)."""
    namespace = "chart-fence-check"
    kube.put_object(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    pem = tls.Authority("an API server's webhook client CA").cert_pem.decode()
    forms = [
        (
            API_SERVER,
            (
                "--set",
                "networkPolicy.apiServer.cidrs={10.0.0.2/32,fd00::1/128}",
                "--set-json",
                f"networkPolicy.apiServer.peers={json.dumps([KONNECTIVITY])}",
                "--set-json",
                'networkPolicy.metrics.podSelector={"matchLabels":{"app":"prometheus"}}',
            ),
        ),
        ((), ("--set-string", f"webhookClientCA={pem}")),
        (API_SERVER, ("--set", "networkPolicy.metrics.namespaceSelector=null")),
    ]
    seen = []
    for fence, values in forms:
        policy = one(render(helm, *values, release=namespace, namespace=namespace, fence=fence), "NetworkPolicy")
        stored = kube.create(kinds.kind("NetworkPolicy"), policy, dry_run=True)
        assert stored["spec"]["podSelector"] == policy["spec"]["podSelector"]
        seen.append(len(stored["spec"]["ingress"]))
    assert seen == [2, 2, 1]
