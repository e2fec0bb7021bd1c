"""KubeVirt in the loop (§11.1): a control plane of its own with kube-scheduler, KubeVirt's
virt-api and virt-controller and a fake kubelet, and the operator as its own identity.

Everything here goes through `VirtualMachine` objects as a tenant would. Where KubeVirt
cannot be had (no source, no binaries), every test of the tier skips saying why.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from cozygpu.api import kinds
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import Kube
from tests.support.bodies import gpu_class_body
from tests.support.harness import OperatorProcess
from tests.support.kubevirt import Nodes, kubevirt_operator, kubevirt_plane
from tests.support.nodes import Gpu, fresh_gpu

pytestmark = pytest.mark.kubevirt


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


@pytest.fixture
def gpu(kv: Kube, kv_operator: OperatorProcess) -> Iterator[Gpu]:
    """A fresh resource name and a passthrough class for it: no other test's nodes or pods compete."""
    g = fresh_gpu()
    kv.create(kinds.GPU_CLASS, gpu_class_body(g.cls, g.resource))
    yield g
    kv.delete(kinds.GPU_CLASS, g.cls)


@pytest.fixture
def kv_nodes(kv: Kube, gpu: Gpu) -> Iterator[Nodes]:
    made = Nodes(kv, gpu)
    yield made
    for name in made.made:
        kv.delete(kinds.NODE, name)
