"""Shared fixtures: one real control plane per test session (§11), no mocks.

The control plane is started lazily by the first test that asks for it, so unit
tests run without it. Its binaries come from KUBEBUILDER_ASSETS or the hack
script's cache (built on first use). Fixtures only: what they are built from is in
tests/support, which tests import directly.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from cozygpu.api import kinds
from cozygpu.devcluster import identity, nodes
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import Body, Kube
from tests.support.bodies import gpu_class_body
from tests.support.harness import OperatorProcess, wait_for
from tests.support.invariants import stale
from tests.support.nodes import Gpu, GPUNodeFactory, fresh_gpu, gpu_node_name, wait_until_accounted
from tests.support.operators import start_admitting_operator, start_operator, unregister_webhooks


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    with ControlPlane() as plane:
        yield plane


@pytest.fixture(scope="session")
def kube(control_plane: ControlPlane) -> Kube:
    return control_plane.kube()


@pytest.fixture(scope="session")
def operator_kubeconfig(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The operator's own identity: a ServiceAccount bound to the chart's ClusterRole and nothing more (§10).

    Every operator the tests start runs as it, so every integration test also proves the RBAC is enough."""
    return identity.write_kubeconfig(control_plane, tmp_path_factory.mktemp("identity") / "operator-kubeconfig")


@pytest.fixture(scope="session")
def api_server_cert(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A client certificate (file, key file) of the CA whose certificate the API server presents to webhooks
    (§14.1): for tests that post reviews to the webhook as the API server would."""
    client = control_plane.webhook_ca.client("kube-apiserver-webhook-client")
    directory = tmp_path_factory.mktemp("api-server-cert")
    (directory / "tls.crt").write_bytes(client.cert_pem)
    (directory / "tls.key").write_bytes(client.key_pem)
    return str(directory / "tls.crt"), str(directory / "tls.key")


@pytest.fixture(scope="session")
def metrics_token(kube: Kube) -> str:
    """A scraper's token: its ServiceAccount bound to the chart's metrics-reader ClusterRole (§14.4)."""
    return identity.metrics_token(kube)


@pytest.fixture(scope="session")
def as_operator(operator_kubeconfig: Path) -> Kube:
    """A client with the operator's identity, for writing what only the operator may (template devices, §9.1)."""
    return Kube.from_kubeconfig(operator_kubeconfig)


@pytest.fixture(scope="module")
def admitting(
    control_plane: ControlPlane, operator_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """The operator with its webhooks registered, one per test module; unregistered after."""
    process = start_admitting_operator(operator_kubeconfig, tmp_path_factory.mktemp("admitting"), "--bind-timeout", "5")
    yield process
    process.stop()
    unregister_webhooks(control_plane.kube())


@pytest.fixture(scope="module")
def operator(operator_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """The operator without webhooks, one per test module, so tests can write what the webhook writes."""
    process = start_operator(operator_kubeconfig, tmp_path_factory.mktemp("operator"), "--no-webhooks")
    yield process
    process.stop()


@pytest.fixture
def namespace(kube: Kube) -> Iterator[str]:
    """A fresh namespace per test; without a controller manager it stays Terminating, unused."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    kube.create(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    kube.delete(kinds.NAMESPACE, name)


@pytest.fixture
def nothing_stale(kube: Kube, namespace: str) -> Iterator[None]:
    """After the scenario: no attachment without its VMI, no unanswered request, no orphan template device."""
    yield
    wait_for("nothing stale", lambda: not stale(kube, namespace), timeout=15)


@pytest.fixture
def gpu_node(kube: Kube) -> Iterator[GPUNodeFactory]:
    """Creates fake GPU nodes with unique names; deletes them after the test."""
    made: list[str] = []

    def make(
        gpus: Mapping[str, int],
        *,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, str]] = (),
        unschedulable: bool = False,
        ready: bool = True,
        name: str | None = None,
    ) -> Body:
        name = name or gpu_node_name()
        body = nodes.create_gpu_node(
            kube, name, gpus, labels=labels, taints=taints, unschedulable=unschedulable, ready=ready
        )
        made.append(name)
        wait_until_accounted(kube, name, gpus, {**(labels or {}), "kubernetes.io/hostname": name})
        return body

    yield make
    for name in made:
        kube.delete(kinds.NODE, name)


@pytest.fixture
def gpu(kube: Kube) -> Iterator[Gpu]:
    """A fresh resource name and a passthrough class for it: no other test's nodes compete."""
    g = fresh_gpu()
    kube.create(kinds.GPU_CLASS, gpu_class_body(g.cls, g.resource))
    yield g
    kube.delete(kinds.GPU_CLASS, g.cls)
