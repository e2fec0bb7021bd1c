"""Shared fixtures: one real control plane per test session (§11), no mocks.

The control plane is started lazily by the first test that asks for it, so unit
tests run without it. Its binaries come from KUBEBUILDER_ASSETS or the hack
script's cache (built on first use).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from cozygpu.api import kinds
from cozygpu.devcluster import identity, nodes
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.devcluster.harness import OperatorProcess, wait_for
from cozygpu.kube.adapter import ApiError, Body, Kube
from tests.helpers import gpu_class_body, gpu_device_body, stale

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    with ControlPlane() as plane:
        yield plane


@pytest.fixture(scope="session")
def kube(control_plane: ControlPlane) -> Kube:
    return control_plane.kube()


OPERATOR_USER = identity.USERNAME


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


def start_operator(kubeconfig: Path, directory: Path, *args: str) -> OperatorProcess:
    """An operator process the node helpers know is running (they then wait until it has seen new nodes)."""
    process = OperatorProcess(kubeconfig, directory / "operator.log", *args).start()
    _RUNNING.append(process)
    return process


def start_admitting_operator(kubeconfig: Path, directory: Path, *extra: str) -> OperatorProcess:
    """The whole operator with webhooks (--dev), as its own identity, so the template-label rule can tell it apart."""
    return start_operator(kubeconfig, directory, "--dev", *extra)


@pytest.fixture(scope="module")
def admitting(
    control_plane: ControlPlane, operator_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """The operator with its webhooks registered, one per test module; unregistered after."""
    process = start_admitting_operator(operator_kubeconfig, tmp_path_factory.mktemp("admitting"), "--bind-timeout", "5")
    yield process
    process.stop()
    unregister_webhooks(control_plane.kube())


def unregister_webhooks(kube: Kube) -> None:
    """Delete the dev configurations, then wait until the API server's cache of them has let go too.

    Without the wait, the next writes (a cleanup, the next module's) may still be sent to a dead port.
    """
    kube.delete(kinds.MUTATING_WEBHOOKS, "cozy-gpu-operator")
    kube.delete(kinds.VALIDATING_WEBHOOKS, "cozy-gpu-operator")

    def let_go() -> bool:
        try:
            kube.create(kinds.GPU_DEVICE, gpu_device_body(f"probe-{uuid.uuid4().hex[:8]}", "default", "none"),
                        dry_run=True)  # fmt: skip
        except ApiError as e:
            if "failed calling webhook" in e.message:
                return False
            raise
        return True

    wait_for("the API server to stop calling removed webhooks", let_go, timeout=15)


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


_node_numbers = itertools.count()


def wait_until_accounted(kube: Kube, node: str, gpus: Mapping[str, int], labels: Mapping[str, str]) -> None:
    """When a class serves the node and an operator runs, wait until its GPUNode shows the units.

    The operator decides from its view, which hears of a new node a moment later; a test
    that creates a device right after the node would otherwise race that watch event.
    """
    served = {
        c["spec"]["resourceName"]
        for c in kube.list(kinds.GPU_CLASS)
        if c["spec"]["resourceName"] in gpus
        and all(labels.get(k) == v for k, v in (c["spec"].get("nodeSelector") or {}).items())
    }
    if not served or not _operator_running():
        return

    def accounted() -> bool:
        body = kube.get_or_none(kinds.GPU_NODE, node) or {}
        have = {r["name"]: r["allocatable"] for r in body.get("status", {}).get("resources", [])}
        return all(have.get(r) == gpus[r] for r in served)

    wait_for(f"GPUNode {node} accounted", accounted, timeout=20)


_RUNNING: list[OperatorProcess] = []


def _operator_running() -> bool:
    return any(p.proc is not None and p.proc.poll() is None for p in _RUNNING)


GPUNodeFactory = Callable[..., Body]


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
        name = name or f"gpu-node-{next(_node_numbers)}-{uuid.uuid4().hex[:4]}"
        body = nodes.create_gpu_node(
            kube, name, gpus, labels=labels, taints=taints, unschedulable=unschedulable, ready=ready
        )
        made.append(name)
        wait_until_accounted(kube, name, gpus, {**(labels or {}), "kubernetes.io/hostname": name})
        return body

    yield make
    for name in made:
        kube.delete(kinds.NODE, name)


@dataclass(frozen=True)
class Gpu:
    resource: str
    cls: str


@pytest.fixture
def gpu(kube: Kube) -> Iterator[Gpu]:
    """A fresh resource name and a passthrough class for it: no other test's nodes compete."""
    tag = uuid.uuid4().hex[:6]
    g = Gpu(f"example.com/gpu-{tag}", f"cls-{tag}")
    kube.create(kinds.GPU_CLASS, gpu_class_body(g.cls, g.resource))
    yield g
    kube.delete(kinds.GPU_CLASS, g.cls)
