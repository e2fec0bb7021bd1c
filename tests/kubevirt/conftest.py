"""KubeVirt in the loop (§11.1): a control plane of its own with kube-scheduler, KubeVirt's
virt-api and virt-controller and a fake kubelet, and the operator as its own identity.

Everything here goes through `VirtualMachine` objects as a tenant would. Where KubeVirt
cannot be had (no source, no binaries), every test of the tier skips saying why.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from cozygpu.api import kinds
from cozygpu.devcluster import binaries, identity, nodes
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.devcluster.harness import OperatorProcess, wait_for
from cozygpu.kube.adapter import Kube
from tests.helpers import gpu_class_body

pytestmark = pytest.mark.kubevirt


def kubevirt_plane() -> Iterator[ControlPlane]:
    """A control plane with KubeVirt's controllers, for a fixture of any scope; skips saying why where it cannot."""
    plane = ControlPlane(kubevirt=True)
    try:
        plane.start(timeout=180)
    except binaries.KubeVirtUnavailable as e:
        pytest.skip(f"KubeVirt in the loop: {e}; see the README (KUBEVIRT_SRC or KUBEVIRT_ASSETS)")
    yield plane
    plane.stop()


def kubevirt_operator(plane: ControlPlane, directory: Path) -> Iterator[OperatorProcess]:
    """The operator with its webhooks (--dev), as its own ServiceAccount under the chart's RBAC."""
    kubeconfig = identity.write_kubeconfig(plane, directory / "kubeconfig")
    process = OperatorProcess(kubeconfig, directory / "operator.log", "--dev", "--bind-timeout", "5").start()
    yield process
    process.stop()


@pytest.fixture(scope="session")
def kv_plane() -> Iterator[ControlPlane]:
    yield from kubevirt_plane()


@pytest.fixture(scope="session")
def kv(kv_plane: ControlPlane) -> Kube:
    """An administrator of the KubeVirt control plane (the tests' own hands)."""
    return kv_plane.kube()


@pytest.fixture(scope="session")
def as_kubevirt_controller(kv_plane: ControlPlane) -> Kube:
    """KubeVirt's controller identity, to render a pod the way virt-controller does."""
    assert kv_plane.kubevirt is not None
    return Kube.from_kubeconfig(kv_plane.kubevirt.controller_kubeconfig)


@pytest.fixture(scope="session")
def kv_operator(kv_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    yield from kubevirt_operator(kv_plane, tmp_path_factory.mktemp("kv-operator"))


@pytest.fixture
def ns(kv: Kube) -> Iterator[str]:
    name = f"kv-{uuid.uuid4().hex[:8]}"
    kv.create(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    kv.delete(kinds.NAMESPACE, name)


@dataclass(frozen=True)
class Gpu:
    resource: str
    cls: str


@pytest.fixture
def gpu(kv: Kube, kv_operator: OperatorProcess) -> Iterator[Gpu]:
    """A fresh resource name and a passthrough class for it: no other test's nodes or pods compete."""
    tag = uuid.uuid4().hex[:6]
    g = Gpu(f"example.com/gpu-{tag}", f"cls-{tag}")
    kv.create(kinds.GPU_CLASS, gpu_class_body(g.cls, g.resource))
    yield g
    kv.delete(kinds.GPU_CLASS, g.cls)


class Nodes:
    """Fake nodes as virt-handler would leave them, with units of the test's GPU resource."""

    def __init__(self, kube: Kube, gpu: Gpu) -> None:
        self._kube = kube
        self._gpu = gpu
        self.made: list[str] = []

    def add(self, units: int, *, labels: Mapping[str, str] | None = None, small: bool = False) -> str:
        """A node with `units` of the GPU resource; `small`: 2 CPUs, so kube-scheduler's scoring shuns it."""
        name = f"kv-node-{uuid.uuid4().hex[:6]}"
        resources: dict[str, int | str] = {self._gpu.resource: units}
        if small:
            resources |= {"cpu": "2", "memory": "4Gi"}
        nodes.create_gpu_node(self._kube, name, resources, labels=labels, kubevirt=True)
        self.made.append(name)

        def accounted() -> bool:
            body = self._kube.get_or_none(kinds.GPU_NODE, name) or {}
            return any(r["allocatable"] == units for r in body.get("status", {}).get("resources", []))

        # The operator decides from its view: wait until it has heard of the node.
        wait_for(f"GPUNode {name} accounted", accounted, timeout=20)
        return name


@pytest.fixture
def kv_nodes(kv: Kube, gpu: Gpu) -> Iterator[Nodes]:
    made = Nodes(kv, gpu)
    yield made
    for name in made.made:
        kv.delete(kinds.NODE, name)
