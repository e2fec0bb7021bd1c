"""The hostile-tenant tier (§14, issue 19 item 7): each finding of issue 19 tried as an attacker would.

Two tenants, `mallory` and a `victim`, each a ServiceAccount in a namespace of its own holding
exactly the chart's tenant role (cozy-gpu-tenant-edit) and the VMI rights KubeVirt's own
`kubevirt.io:edit` grants, nothing more; for §14.1, a client on the webhook's address with no
certificate the API server would present. Every move goes through the real API server (and
KubeVirt's controllers where the finding needs a launcher pod), ends refused or harmless, and
is followed by the reliability tier's invariant checker over both tenants' namespaces.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cozygpu.api import kinds
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import Kube
from tests.support.bodies import gpu_class_body
from tests.support.harness import OperatorProcess
from tests.support.kubevirt import (
    KVNodeFactory,
    add_kubevirt_node,
    kubevirt_operator,
    kubevirt_plane,
    wait_until_kubevirt_node_accounted,
)
from tests.support.nodes import Gpu, fresh_gpu
from tests.support.tenants import Tenant, make_tenant


@pytest.fixture
def mallory(control_plane: ControlPlane, kube: Kube, tmp_path: Path) -> Tenant:
    return make_tenant(control_plane, kube, "mallory", tmp_path)


@pytest.fixture
def victim(control_plane: ControlPlane, kube: Kube, tmp_path: Path) -> Tenant:
    return make_tenant(control_plane, kube, "victim", tmp_path)


# -- KubeVirt in the loop, for the findings that need a launcher pod ------------------------------------------
# Module-scoped, unlike tests/kubevirt's session plane: the tier runs first, and its plane is gone before that
# tier starts its own, so the two never run side by side on a small machine.


@pytest.fixture(scope="module")
def kv_plane() -> Iterator[ControlPlane]:
    yield from kubevirt_plane()


@pytest.fixture(scope="module")
def kv(kv_plane: ControlPlane) -> Kube:
    """An administrator of the KubeVirt control plane (the tests' own hands: nodes, classes, budgets)."""
    return kv_plane.kube()


@pytest.fixture(scope="module")
def kv_operator(kv_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    yield from kubevirt_operator(kv_plane, tmp_path_factory.mktemp("kv-operator"))


@pytest.fixture
def kv_gpu(kv: Kube, kv_operator: OperatorProcess) -> Iterator[Gpu]:
    """A fresh resource name and a passthrough class for it."""
    g = fresh_gpu()
    kv.create(kinds.GPU_CLASS, gpu_class_body(g.cls, g.resource))
    yield g
    kv.delete(kinds.GPU_CLASS, g.cls)


@pytest.fixture
def kv_node(kv: Kube, kv_gpu: Gpu) -> Iterator[KVNodeFactory]:
    """Fake nodes as virt-handler would leave them, with units of the test's GPU resource; waits until the
    operator has heard of each."""
    made: list[str] = []

    def add(units: int) -> str:
        name = add_kubevirt_node(kv, kv_gpu, units)
        made.append(name)
        wait_until_kubevirt_node_accounted(kv, name, units)
        return name

    yield add
    for name in made:
        kv.delete(kinds.NODE, name)


@pytest.fixture
def kv_mallory(kv_plane: ControlPlane, kv: Kube, tmp_path: Path) -> Tenant:
    return make_tenant(kv_plane, kv, "mallory", tmp_path)


@pytest.fixture
def kv_victim(kv_plane: ControlPlane, kv: Kube, tmp_path: Path) -> Tenant:
    return make_tenant(kv_plane, kv, "victim", tmp_path)
