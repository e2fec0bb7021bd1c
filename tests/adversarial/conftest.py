"""The hostile-tenant tier (§14, issue 19 item 7): each finding of issue 19 tried as an attacker would.

Two tenants, `mallory` and a `victim`, each a ServiceAccount in a namespace of its own holding
exactly the chart's tenant role (cozy-gpu-tenant-edit) and the VMI rights KubeVirt's own
`kubevirt.io:edit` grants, nothing more; for §14.1, a client on the webhook's address with no
certificate the API server would present. Every move goes through the real API server (and
KubeVirt's controllers where the finding needs a launcher pod), ends refused or harmless, and
is followed by the reliability tier's invariant checker over both tenants' namespaces.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cozygpu.api import kinds
from cozygpu.api.names import API_VERSION
from cozygpu.devcluster import identity, nodes
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.devcluster.harness import OperatorProcess, wait_for
from cozygpu.kube.adapter import Body, Kube
from tests.helpers import gpu_class_body
from tests.kubevirt.conftest import Gpu, kubevirt_operator, kubevirt_plane
from tests.reliability import invariants

RBAC = "rbac.authorization.k8s.io"
# The rule of KubeVirt's `kubevirt.io:edit` ClusterRole on VMs and VMIs (kv-dump -what=rbac), for the control
# plane without KubeVirt, where that role is not installed.
KUBEVIRT_EDIT_VMIS = {
    "apiGroups": ["kubevirt.io"],
    "resources": ["virtualmachines", "virtualmachineinstances"],
    "verbs": ["get", "delete", "create", "update", "patch", "list", "watch"],
}


@dataclass(frozen=True)
class Tenant:
    """A tenant as the platform makes one: a ServiceAccount with the namespace roles, and its own client."""

    name: str
    namespace: str
    kube: Kube
    token: str
    kubeconfig: Path  # for a client of its own per thread

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}"


def make_tenant(plane: ControlPlane, admin: Kube, name: str, directory: Path) -> Tenant:
    """A fresh namespace and a ServiceAccount `name` there, bound to cozy-gpu-tenant-edit and to KubeVirt's
    kubevirt.io:edit (where KubeVirt runs; otherwise a Role with that role's VM and VMI rule)."""
    identity.install(admin)  # the chart's tenant ClusterRoles
    namespace = f"{name}-{uuid.uuid4().hex[:6]}"
    admin.create(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    admin.create(kinds.kind("ServiceAccount"), {"apiVersion": "v1", "kind": "ServiceAccount",
                                                "metadata": {"name": name, "namespace": namespace}})  # fmt: skip
    vmis = ("ClusterRole", "kubevirt.io:edit")
    if admin.get_or_none(kinds.kind("ClusterRole"), "kubevirt.io:edit") is None:
        vmis = ("Role", "kubevirt-edit-vmis")
        admin.create(kinds.kind("Role"), {"apiVersion": f"{RBAC}/v1", "kind": "Role",
                     "metadata": {"name": vmis[1], "namespace": namespace}, "rules": [KUBEVIRT_EDIT_VMIS]})  # fmt: skip
    for kind, role in (("ClusterRole", "cozy-gpu-tenant-edit"), vmis):
        admin.create(kinds.kind("RoleBinding"), {"apiVersion": f"{RBAC}/v1", "kind": "RoleBinding",
                     "metadata": {"name": role.replace(":", "-"), "namespace": namespace},
                     "roleRef": {"apiGroup": RBAC, "kind": kind, "name": role},
                     "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]})  # fmt: skip
    token = admin.request_token(namespace, name)
    user = f"system:serviceaccount:{namespace}:{name}"
    config = plane.write_token_kubeconfig(directory / f"{namespace}.kubeconfig", user, token, namespace=namespace)
    return Tenant(name, namespace, Kube.from_kubeconfig(config), token, config)


@pytest.fixture
def mallory(control_plane: ControlPlane, kube: Kube, tmp_path: Path) -> Tenant:
    return make_tenant(control_plane, kube, "mallory", tmp_path)


@pytest.fixture
def victim(control_plane: ControlPlane, kube: Kube, tmp_path: Path) -> Tenant:
    return make_tenant(control_plane, kube, "victim", tmp_path)


def assert_invariants(
    kube: Kube, tenants: tuple[Tenant, ...], operator: OperatorProcess | None = None, timeout: float = 20.0
) -> None:
    """The reliability tier's invariants (invariants.violations, for each tenant's namespace) hold once the
    operator has caught up. The wait is shorter than the grace period (120 s), so nothing an attack left
    is cleared by the collector before the check sees it."""

    def now() -> list[str]:
        return [f"{t.namespace}: {v}" for t in tenants for v in invariants.violations(kube, t.namespace, operator)]

    with contextlib.suppress(AssertionError):  # what still fails after the wait is named below
        wait_for("every invariant to hold", lambda: not now(), timeout=timeout)
    assert now() == []


def budget_body(
    namespace: str, name: str = "cap", *, total: int | None = None, limits: Mapping[str, int] | None = None,
    selector: Mapping[str, str] | None = None,
) -> Body:  # fmt: skip
    """A GPUBudget as the platform sets it (tenants may only read budgets)."""
    spec: dict[str, Any] = {"limits": dict(limits or {})}
    if total is not None:
        spec["total"] = total
    if selector is not None:
        spec["namespaceSelector"] = {"matchLabels": dict(selector)}
    return {"apiVersion": API_VERSION, "kind": "GPUBudget", "metadata": {"name": name, "namespace": namespace},
            "spec": spec}  # fmt: skip


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
    tag = uuid.uuid4().hex[:6]
    g = Gpu(f"example.com/gpu-{tag}", f"cls-{tag}")
    kv.create(kinds.GPU_CLASS, gpu_class_body(g.cls, g.resource))
    yield g
    kv.delete(kinds.GPU_CLASS, g.cls)


KVNodeFactory = Callable[[int], str]


@pytest.fixture
def kv_node(kv: Kube, kv_gpu: Gpu) -> Iterator[KVNodeFactory]:
    """Fake nodes as virt-handler would leave them, with units of the test's GPU resource; waits until the
    operator has heard of each."""
    made: list[str] = []

    def add(units: int) -> str:
        name = f"kv-node-{uuid.uuid4().hex[:6]}"
        nodes.create_gpu_node(kv, name, {kv_gpu.resource: units}, kubevirt=True)
        made.append(name)

        def accounted() -> bool:
            body: Mapping[str, Any] = kv.get_or_none(kinds.GPU_NODE, name) or {}
            return any(r["allocatable"] == units for r in body.get("status", {}).get("resources", []))

        wait_for(f"GPUNode {name} accounted", accounted, timeout=20)
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
