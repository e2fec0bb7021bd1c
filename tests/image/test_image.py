"""The operator's image (issue 13): built by hack/build-image.sh, run as the chart's Deployment runs it.

Where no builder is present the tier skips with the build script's reason. The container gets exactly what
`helm template` renders for the Deployment: the image's entrypoint with the chart's args, the chart's env (the
downward API's fields filled in as a kubelet would), the webhook certificate Secret at its mount path, a tmpfs
for the chart's /tmp emptyDir, and in-cluster credentials (token, CA, KUBERNETES_SERVICE_HOST/PORT) of the
chart's ServiceAccount under the chart's ClusterRole and Role. It shares the host's network and reaches the dev
cluster's API server on loopback. The API server calls its webhooks through the chart's own webhook
configurations and CA bundle; with no kube-proxy here, their Service is an ExternalName for localhost and their
port the container's (9443: the Service's 443 -> webhook is kube-proxy's part).

The chart is rendered with `webhookClientCA` set to the CA the dev control plane publishes (the ConfigMap
cozy-gpu-system/cozy-gpu-webhook-client-ca; its kube-apiserver presents a client certificate of that CA to every
webhook under an AdmissionConfiguration), so the image runs with COZYGPU_WEBHOOK_CLIENT_CA and the chart's
ConfigMap mounted where it points (§14.1): every admission below is the API server's, through the TLS handshake
that turns away a caller without that certificate, which a test here shows. The chart's NetworkPolicy is not
installed: nothing here enforces one (tests/integration/test_chart.py checks it, tests/e2e under kind).

buildah cannot make a container's root read-only, so where the chart sets readOnlyRootFilesystem the tier checks
instead that the operator wrote nothing outside /tmp: the container's root filesystem before and after it ran.
"""

from __future__ import annotations

import base64
import copy
import http.client
import json
import socket
import ssl
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from cozygpu import __version__, tls
from cozygpu.api import kinds
from cozygpu.api.names import DEV_NAMESPACE, DEV_WEBHOOK_CLIENT_CA
from cozygpu.devcluster import binaries
from cozygpu.devcluster.bodies import vmi_body
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import ApiError, Kube
from tests.support.bodies import gpu_device_body
from tests.support.harness import wait_for
from tests.support.image import Container, build, config, write_volume
from tests.support.nodes import Gpu, GPUNodeFactory
from tests.support.objects import device_status, held
from tests.support.refusals import refused

pytestmark = pytest.mark.image

CHART = binaries.repo_root() / "charts" / "cozy-gpu-operator"
# Not the dev identity's names: the chart's RBAC alone, bound to a ServiceAccount no other test widens.
RELEASE = NAMESPACE = "cozy-gpu-image"
POD = f"{RELEASE}-5d9c7b8f4-x2x7q"  # metadata.name of the Deployment's pod, for the downward API
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
WEBHOOKS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    [found] = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return found


@dataclass
class Deployed:
    """The chart's rendered objects, the image's configuration and the container running it."""

    image: str
    image_config: dict[str, Any]
    docs: list[dict[str, Any]]
    container: Container
    log: Path
    version_output: str = ""
    before: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def spec(self) -> dict[str, Any]:
        """The Deployment's container."""
        [container] = one(self.docs, "Deployment")["spec"]["template"]["spec"]["containers"]
        return container  # type: ignore[no-any-return]

    def port(self, name_or_number: str | int) -> int:
        """A port as the chart names it (a probe's or the Service's targetPort), as a number."""
        if isinstance(name_or_number, int):
            return name_or_number
        [port] = [p["containerPort"] for p in self.spec["ports"] if p["name"] == name_or_number]
        return int(port)

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])


@pytest.fixture(scope="module")
def image() -> str:
    return build()


def render(*values: str) -> list[dict[str, Any]]:
    helm = binaries.find(("helm",)) / "helm"
    done = subprocess.run(
        [str(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *values],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def published_client_ca(kube: Kube, directory: Path) -> Path:
    """The dev control plane's webhook client CA, where a platform admin would copy it from (§14.1)."""
    config = kube.get(kinds.kind("ConfigMap"), DEV_WEBHOOK_CLIENT_CA, DEV_NAMESPACE)
    path = directory / "webhook-client-ca.crt"
    path.write_text(config["data"]["ca.crt"])
    return path


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


def install(kube: Kube, docs: list[dict[str, Any]], webhook_port: int) -> None:
    """The chart's namespace-side objects and RBAC, its webhook configurations routed to the container."""
    kube.put_object(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    for kind in ("ServiceAccount", "Secret", "ConfigMap", "Role", "RoleBinding", "ClusterRoleBinding"):
        kube.put_object(kinds.kind(kind), one(docs, kind))
    kube.put_object(kinds.kind("ClusterRole"), one(docs, "ClusterRole", RELEASE))
    service = copy.deepcopy(one(docs, "Service"))  # the tests read the chart's own Service and configurations
    service["spec"] = {"type": "ExternalName", "externalName": "localhost"}
    kube.put_object(kinds.kind("Service"), service)
    for kind in WEBHOOKS:
        configuration = copy.deepcopy(one(docs, kind))
        for hook in configuration["webhooks"]:
            hook["clientConfig"]["service"]["port"] = webhook_port
        kube.put_object(kinds.kind(kind), configuration)
    # The no-bypass policies and their bindings (§12.3): a class is Ready once the policy is seen guarding it.
    for doc in docs:
        if doc["kind"] in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
            kube.put_object(kinds.kind(doc["kind"]), doc)


def uninstall(kube: Kube, docs: list[dict[str, Any]]) -> None:
    # The policies stay, as `--dev` leaves them: a binding deleted leaves the API server blind to the policy's
    # parameter for the rest of the session (kubernetes/kubernetes#130887), and the next operator takes them over.
    for kind in WEBHOOKS:  # by the names the chart gives them (the mutating one's sorts after KubeVirt's)
        kube.delete(kinds.kind(kind), one(docs, kind)["metadata"]["name"])
    kube.delete(kinds.kind("ClusterRoleBinding"), RELEASE)
    kube.delete(kinds.kind("ClusterRole"), RELEASE)
    kube.delete(kinds.NAMESPACE, NAMESPACE)


def environment(spec: dict[str, Any], plane: ControlPlane) -> dict[str, str]:
    """The chart's env with the downward API resolved, and what a kubelet adds for in-cluster clients."""
    fields = {"metadata.name": POD, "metadata.namespace": NAMESPACE}
    env = {
        e["name"]: e["value"] if "value" in e else fields[e["valueFrom"]["fieldRef"]["fieldPath"]] for e in spec["env"]
    }
    host, port = plane.server.removeprefix("https://").rsplit(":", 1)
    return {**env, "KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}


@pytest.fixture(scope="module")
def deployed(
    image: str, control_plane: ControlPlane, kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployed]:
    """The chart installed (webhooks to the container) and the image running with the Deployment's settings, the
    API server's webhook client CA among them."""
    where = tmp_path_factory.mktemp("image")
    docs = render("--set-file", f"webhookClientCA={published_client_ca(kube, where)}")
    [spec] = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    ports = sorted(p["containerPort"] for p in spec["ports"])
    if busy := [p for p in ports if port_in_use(p)]:
        pytest.skip(f"port(s) {busy} in use on this host: the container shares the host's network")
    webhook_port = next(p["containerPort"] for p in spec["ports"] if p["name"] == "webhook")
    image_config = config(image)
    volumes = {m["name"]: m["mountPath"] for m in spec["volumeMounts"]}
    assert set(volumes) == {"tls", "tmp", "client-ca"}, "a new volume in the chart: mount it here too"
    [client_ca] = [
        v["configMap"]["name"]
        for v in one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
        if v["name"] == "client-ca"
    ]
    install(kube, docs, webhook_port)
    container: Container | None = None
    try:
        secret = one(docs, "Secret")["data"]
        ca_files = one(docs, "ConfigMap", client_ca)["data"]
        mounts = {
            volumes["tls"]: write_volume(where / "tls", {k: base64.b64decode(v) for k, v in secret.items()}),
            volumes["client-ca"]: write_volume(where / "client-ca", {k: v.encode() for k, v in ca_files.items()}),
            SA_DIR: write_volume(
                where / "serviceaccount",
                {
                    "token": kube.request_token(NAMESPACE, RELEASE).encode(),
                    "ca.crt": control_plane.ca.cert_pem,
                    "namespace": NAMESPACE.encode(),
                },
            ),
        }
        container = Container(image, mounts, environment(spec, control_plane))
        deployed = Deployed(image, image_config, docs, container, where / "operator.log")
        # First a short run with the same mounts, so their mount points exist before the snapshot.
        answer = container.run([*image_config["Entrypoint"], "--version"])
        assert answer.returncode == 0, answer.stderr
        deployed.version_output = answer.stdout.strip()
        deployed.before = container.snapshot()
        command = spec.get("command") or image_config["Entrypoint"]
        container.start([*command, *spec.get("args", image_config.get("Cmd") or [])], deployed.log)
        ready = deployed.port(spec["readinessProbe"]["httpGet"]["port"])

        def is_ready() -> bool:
            assert deployed.container.running(), f"the operator exited:\n{deployed.tail()}"
            try:
                return requests.get(f"http://127.0.0.1:{ready}/readyz", timeout=2).status_code == 200
            except requests.RequestException:
                return False

        wait_for("the operator in the image ready", is_ready, timeout=120)
        yield deployed
    finally:
        if container is not None:
            container.remove()
        uninstall(kube, docs)


def gpunode_units(kube: Kube, node: str) -> int:
    body = kube.get_or_none(kinds.GPU_NODE, node) or {}
    return sum(r.get("allocatable", 0) for r in body.get("status", {}).get("resources", []))


# -- the image as built --------------------------------------------------------------------------


def test_version_inside_the_image_is_the_charts_app_version(deployed: Deployed) -> None:
    """`cozygpu --version` in the image, its OCI version label and Chart.yaml's appVersion are one version."""
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert deployed.version_output == app_version == __version__
    assert deployed.image_config["Labels"]["org.opencontainers.image.version"] == app_version
    assert deployed.image.endswith(f":{app_version}")


def test_the_image_user_is_numeric_and_not_root(deployed: Deployed) -> None:
    """runAsNonRoot can verify the image's user only if it is numeric; the operator runs as that user."""
    user, _, group = deployed.image_config["User"].partition(":")
    assert user.isdigit() and int(user) != 0, deployed.image_config["User"]
    assert group.isdigit() and int(group) != 0
    assert deployed.spec["securityContext"].get("runAsUser") is None  # the image's user is the one that runs
    processes = deployed.container.processes()
    assert processes and {p["uid"] for p in processes} == {int(user)}


def test_the_image_holds_the_operator_and_nothing_to_build_it(deployed: Deployed) -> None:
    """No source tree, wheels, pip or build venv: only the operator's venv with its dependencies."""
    answer = deployed.container.run(
        [
            "/opt/cozygpu/bin/python",
            "-c",
            "import importlib.util as u, os; print("
            "[p for p in ('/src', '/wheels', '/build') if os.path.exists(p)],"
            "[m for m in ('pip', 'setuptools', 'wheel') if u.find_spec(m)])",
        ]
    )
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.strip() == "[] []"


# -- the chart's Pod spec against the process ----------------------------------------------------


def test_the_probes_answer_on_the_port_the_chart_names(deployed: Deployed) -> None:
    """readinessProbe and livenessProbe: 200 on the container port they name."""
    for probe in ("readinessProbe", "livenessProbe"):
        get = deployed.spec[probe]["httpGet"]
        answer = requests.get(f"http://127.0.0.1:{deployed.port(get['port'])}{get['path']}", timeout=5)
        assert answer.status_code == 200, (probe, answer.text)


def test_metrics_are_served_on_the_services_http_port_to_the_charts_metrics_reader(
    deployed: Deployed, kube: Kube
) -> None:
    """The Service's http port leads to /metrics (§14.4): 401 without a token; the cozygpu_ series for a
    scraper bound to the chart's metrics-reader ClusterRole, checked by the image with the chart's RBAC."""
    [http] = [p for p in one(deployed.docs, "Service")["spec"]["ports"] if p["name"] == "http"]
    url = f"http://127.0.0.1:{deployed.port(http['targetPort'])}/metrics"
    assert requests.get(url, timeout=5).status_code == 401
    reader = one(deployed.docs, "ClusterRole", f"{RELEASE}-metrics-reader")
    kube.put_object(kinds.kind("ClusterRole"), reader)
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "scraper", "namespace": NAMESPACE}}
    kube.put_object(kinds.kind("ServiceAccount"), account)
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "scraper"},
        "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": NAMESPACE}],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": reader["metadata"]["name"]},
    }
    kube.put_object(kinds.kind("ClusterRoleBinding"), binding)
    try:
        token = kube.request_token(NAMESPACE, "scraper")
        answer = requests.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=5)
        assert answer.status_code == 200, answer.text
        assert any(line.startswith("cozygpu_") for line in answer.text.splitlines()), answer.text[:2000]
    finally:
        kube.delete(kinds.kind("ClusterRoleBinding"), "scraper")
        kube.delete(kinds.kind("ClusterRole"), reader["metadata"]["name"])


def webhook_call(
    deployed: Deployed, path: str, review: dict[str, Any], client: tls.KeyPair | None, directory: Path
) -> dict[str, Any]:
    """A review POSTed straight to the Service's webhook targetPort, as any pod that reaches the port could: TLS
    verified with the chart's CA for the Service's DNS name, presenting `client`'s certificate or none."""
    [hook] = [p for p in one(deployed.docs, "Service")["spec"]["ports"] if p["name"] == "webhook"]
    ca = base64.b64decode(one(deployed.docs, "Secret")["data"]["ca.crt"]).decode()
    context = ssl.create_default_context(cadata=ca)
    if client is not None:
        cert, key = directory / f"{uuid.uuid4().hex}.crt", directory / f"{uuid.uuid4().hex}.key"
        cert.write_bytes(client.cert_pem)
        key.write_bytes(client.key_pem)
        context.load_cert_chain(cert, key)
    port, name = deployed.port(hook["targetPort"]), f"{RELEASE}.{NAMESPACE}.svc"
    conn = http.client.HTTPSConnection(name, port, context=context, timeout=10)
    conn.sock = context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname=name)
    try:
        conn.request("POST", path, json.dumps(review).encode(), {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200, response.read()
        answer: dict[str, Any] = json.loads(response.read())["response"]
        return answer
    finally:
        conn.close()


def test_the_services_webhook_port_serves_the_charts_certificate(
    deployed: Deployed, control_plane: ControlPlane, tmp_path: Path
) -> None:
    """TLS on the Service's webhook targetPort, verified with the chart's CA for the Service's DNS name, by a caller
    presenting a client certificate of the API server's webhook client CA."""
    [hook] = [p for p in one(deployed.docs, "Service")["spec"]["ports"] if p["name"] == "webhook"]
    ca = base64.b64decode(one(deployed.docs, "Secret")["data"]["ca.crt"]).decode()
    context = ssl.create_default_context(cadata=ca)
    client = control_plane.webhook_ca.client("kube-apiserver-webhook-client")
    (tmp_path / "client.crt").write_bytes(client.cert_pem)
    (tmp_path / "client.key").write_bytes(client.key_pem)
    context.load_cert_chain(tmp_path / "client.crt", tmp_path / "client.key")
    raw = socket.create_connection(("127.0.0.1", deployed.port(hook["targetPort"])), timeout=10)
    with context.wrap_socket(raw, server_hostname=f"{RELEASE}.{NAMESPACE}.svc") as conn:
        assert conn.version()


def test_only_the_api_servers_client_certificate_is_answered(
    deployed: Deployed,
    control_plane: ControlPlane,
    kube: Kube,
    namespace: str,
    gpu: Gpu,
    gpu_node: GPUNodeFactory,
    tmp_path: Path,
) -> None:
    """§14.1 with the chart's webhookClientCA: a review posted straight to the image's VMI webhook for a VMI
    `ghost` naming a held device gets no answer without a client certificate, nor with one of another CA: the
    TLS handshake turns it away, and the device stays unattached. A certificate of the published CA is answered
    (a dry run: nothing written), and the API server, which presents one, has the same VMI admitted."""
    node = gpu_node({gpu.resource: 1})["metadata"]["name"]
    wait_for(f"GPUNode {node} accounted", lambda: gpunode_units(kube, node) == 1)
    held(kube, namespace, "h1", gpu.cls)
    vmi = vmi_body("ghost", namespace, [{"device": "h1"}])
    hooks = one(deployed.docs, "MutatingWebhookConfiguration")["webhooks"]
    [path] = [
        h["clientConfig"]["service"]["path"] for h in hooks if "virtualmachineinstances" in h["rules"][0]["resources"]
    ]

    def review(dry_run: bool) -> dict[str, Any]:
        return {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()),
                "operation": "CREATE",
                "namespace": namespace,
                "name": "ghost",
                "kind": {"group": "kubevirt.io", "version": "v1", "kind": "VirtualMachineInstance"},
                "resource": {"group": "kubevirt.io", "version": "v1", "resource": "virtualmachineinstances"},
                "userInfo": {"username": "mallory"},
                "object": vmi,
                "oldObject": None,
                "dryRun": dry_run,
            },
        }

    for caller in (None, tls.Authority("not the API server's CA").client("kube-apiserver-webhook-client")):
        with pytest.raises((ssl.SSLError, ConnectionError)):
            webhook_call(deployed, path, review(False), caller, tmp_path)
    assert "attachedTo" not in device_status(kube, namespace, "h1")
    assert deployed.container.running(), deployed.tail()
    trusted = control_plane.webhook_ca.client("someone-with-the-api-servers-ca")
    answer = webhook_call(deployed, path, review(True), trusted, tmp_path)
    assert answer["allowed"] is True, answer
    assert "attachedTo" not in device_status(kube, namespace, "h1")
    stored = kube.create(kinds.VMI, vmi)
    assert stored["spec"]["domain"]["devices"]["gpus"] == [{"name": "gpudev0-0", "deviceName": gpu.resource}]
    assert device_status(kube, namespace, "h1")["attachedTo"]["vmi"] == "ghost"


# -- the operator's work, through the API server -------------------------------------------------


def test_a_held_device_is_bound_to_a_node(
    deployed: Deployed, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """The binder in the image accounts the node and binds a held GPUDevice to it."""
    node = gpu_node({gpu.resource: 2})["metadata"]["name"]
    wait_for(f"GPUNode {node} accounted", lambda: gpunode_units(kube, node) == 2)
    status = held(kube, namespace, "h1", gpu.cls)["status"]
    assert (status["phase"], status["nodeName"]) == ("Bound", node)


def test_a_vmi_is_admitted_and_pinned_by_the_webhook_in_the_image(
    deployed: Deployed, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """The API server calls the image's VMI webhook: the VMI gets its gpus and is pinned to the device's node."""
    node = gpu_node({gpu.resource: 1})["metadata"]["name"]
    wait_for(f"GPUNode {node} accounted", lambda: gpunode_units(kube, node) == 1)
    held(kube, namespace, "h1", gpu.cls)
    stored = kube.create(kinds.VMI, vmi_body("vm", namespace, [{"device": "h1"}]))
    assert stored["spec"]["domain"]["devices"]["gpus"] == [{"name": "gpudev0-0", "deviceName": gpu.resource}]
    [term] = stored["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": [node]}]
    status = kube.get(kinds.GPU_DEVICE, "h1", namespace)["status"]
    assert (status["attachedTo"]["vmi"], status["bindRequest"]["result"]) == ("vm", "Succeeded")


def test_a_vmi_naming_a_missing_device_is_refused(deployed: Deployed, kube: Kube, namespace: str) -> None:
    """The image's VMI webhook denies a VMI whose device does not exist, naming it."""
    message = refused(kube, vmi_body("vm", namespace, [{"device": "missing"}]))
    assert "GPUDevice missing does not exist" in message


def test_a_device_of_a_missing_class_is_refused(deployed: Deployed, kube: Kube, namespace: str) -> None:
    """The image's GPUDevice validating webhook, through the chart's configuration, denies an unknown class."""
    name = f"no-such-class-{uuid.uuid4().hex[:6]}"
    with pytest.raises(ApiError) as raised:
        kube.create(kinds.GPU_DEVICE, gpu_device_body("d", namespace, name))
    assert f"GPUClass {name} does not exist" in raised.value.message


# -- last: stops the operator ----------------------------------------------------------------------


def test_the_operator_writes_nothing_outside_tmp_and_stops_on_sigterm(deployed: Deployed) -> None:
    """readOnlyRootFilesystem with /tmp writable suffices: after all the above, the root is as it was; SIGTERM
    (a kubelet's stop) ends the process cleanly."""
    assert deployed.container.stop() == 0, deployed.tail()
    after = deployed.container.snapshot()
    changed = sorted(p for p in set(deployed.before) | set(after) if deployed.before.get(p) != after.get(p))
    # buildah itself makes and removes /run/.containerenv's mount point on every run: /run's own mtime moves.
    assert [p for p in changed if p != "run"] == []
    assert after["run"][:3] == deployed.before["run"][:3]
