"""End to end on kind with KubeVirt (§11): for machines with a Docker engine and network access.

Here the tests skip with the reason; the same checks run against the real API server
in tests/integration on every machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from cozygpu.api import KINDS, crdgen, kinds
from cozygpu.devcluster import binaries
from cozygpu.kube.adapter import Kube
from tests.support.harness import wait_for

pytestmark = pytest.mark.e2e


def _docker_engine() -> str | None:
    """Why kind cannot run here, or None when it can."""
    if shutil.which("docker") is None:
        return "no docker client on this machine"
    probe = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return "no Docker engine is running (docker info failed), so kind cannot start a cluster"
    return None


@pytest.fixture(scope="module")
def kind_kube(request: pytest.FixtureRequest) -> Any:
    reason = _docker_engine()
    if reason:
        pytest.skip(f"kind end-to-end tests need Docker: {reason}")
    kind_cluster = request.getfixturevalue("kind_cluster")
    return Kube.from_kubeconfig(Path(kind_cluster.kubeconfig_path))


def test_crds_install_on_kind(kind_kube: Kube) -> None:
    """Our generated CRDs are accepted and established by a kind cluster's API server."""
    for kind in KINDS:
        kind_kube.create(kinds.CRD, crdgen.crd(kind))
    names = {c["metadata"]["name"] for c in kind_kube.list(kinds.CRD)}
    assert {f"{k.crd.plural}.gpu.cozystack.io" for k in KINDS} <= names


# -- the chart's NetworkPolicy, enforced (§14.1; issue 19 item 1, issue 23 item 3) ---------------------------------

# registry.k8s.io's test image: `porter` serves each SERVE_PORT_<n> on port n, `connect` tries one TCP connection.
AGNHOST = "registry.k8s.io/e2e-test-images/agnhost:2.39"
FENCE = "cozy-gpu-fence"  # the release and its namespace
KINDNET_ENFORCES = (0, 24, 0)  # kindnet enforces NetworkPolicy from kind v0.24.0 (kube-network-policies)


def _kind_version(cluster: Any) -> tuple[int, ...]:
    out = subprocess.run([str(cluster.kind_path), "version"], capture_output=True, text=True, check=True).stdout
    return tuple(int(x) for x in out.split()[1].lstrip("v").split("-")[0].split("."))


def _pod(name: str, namespace: str, labels: dict[str, str], args: list[str], **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"containers": [{"name": name, "image": AGNHOST, "args": args, **container}]},
    }


def _render(namespace: str, *values: str) -> list[dict[str, Any]]:
    helm, chart = binaries.find(("helm",)) / "helm", binaries.repo_root() / "charts" / "cozy-gpu-operator"
    out = subprocess.run(
        [str(helm), "template", namespace, str(chart), "--namespace", namespace, *values],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_the_charts_network_policy_fences_the_operators_ports_on_kind(
    kind_kube: Kube, request: pytest.FixtureRequest
) -> None:
    """§14.1 enforced, not only accepted (which tests/integration/test_chart.py shows everywhere): a stand-in for
    the operator (agnhost serving the Deployment's container ports, with its pod labels and its readiness probe)
    under the chart's NetworkPolicy, its API server address a stand-in pod's IP. Before the policy a tenant's pod
    reaches the webhook port; under it a tenant's pod reaches neither port, the monitoring namespace reaches only
    the http port, the API server's address reaches the webhook port, and the kubelet's probe still passes (a
    pod's node is always admitted). Needs kind v0.24.0 or later, whose kindnet enforces NetworkPolicy."""
    cluster = request.getfixturevalue("kind_cluster")
    if (version := _kind_version(cluster)) < KINDNET_ENFORCES:
        pytest.skip(f"kind {version} does not enforce NetworkPolicy (kindnet does from v0.24.0): set KIND_VERSION")
    pod = kinds.kind("Pod")
    for namespace in (FENCE, "monitoring", "tenant", "apiserver"):
        kind_kube.put_object(
            kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        )
    deployment = next(d for d in _render(FENCE, "--set", "networkPolicy.enabled=false") if d["kind"] == "Deployment")
    [operator] = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in operator["ports"]}
    probe = {"tcpSocket": {"port": operator["readinessProbe"]["httpGet"]["port"]}, "periodSeconds": 2}
    kind_kube.create(
        pod,
        _pod(
            "operator",
            FENCE,
            deployment["spec"]["template"]["metadata"]["labels"],
            ["porter"],
            env=[{"name": f"SERVE_PORT_{n}", "value": name} for name, n in ports.items()],
            ports=operator["ports"],
            readinessProbe=probe,
        ),
    )
    for namespace in ("monitoring", "tenant", "apiserver"):
        kind_kube.create(pod, _pod("client", namespace, {}, ["pause"]))

    def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(cluster.kubectl_path), *args],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig_path)},
        )

    for namespace, name in (
        (FENCE, "operator"),
        ("monitoring", "client"),
        ("tenant", "client"),
        ("apiserver", "client"),
    ):
        done = kubectl("wait", "--for=condition=Ready", f"pod/{name}", "-n", namespace, "--timeout=300s")
        assert done.returncode == 0, done.stderr
    server = kind_kube.get(pod, "operator", FENCE)["status"]["podIP"]
    apiserver = kind_kube.get(pod, "client", "apiserver")["status"]["podIP"]

    def reaches(namespace: str, port: str) -> bool:
        done = kubectl(
            "exec", "-n", namespace, "client", "--", "/agnhost", "connect", f"{server}:{ports[port]}", "--timeout=3s"
        )
        return done.returncode == 0

    assert reaches("tenant", "webhook"), "without the policy the port is open: the check below means something"
    [policy] = [
        d
        for d in _render(FENCE, "--set", f"networkPolicy.apiServer.cidrs={{{apiserver}/32}}")
        if d["kind"] == "NetworkPolicy"
    ]
    kind_kube.create(kinds.kind("NetworkPolicy"), policy)
    try:
        wait_for("the policy enforced", lambda: not reaches("tenant", "webhook"), timeout=120)
        assert not reaches("tenant", "http")
        assert reaches("apiserver", "webhook")
        assert reaches("monitoring", "http")
        assert not reaches("monitoring", "webhook")
        status = kind_kube.get(pod, "operator", FENCE)["status"]
        assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
    finally:
        for namespace in (FENCE, "monitoring", "tenant", "apiserver"):
            kind_kube.delete(kinds.NAMESPACE, namespace)
