"""§10 RBAC against the real API server: the operator has the chart's rules and no more; tenants' roles do
what they say. (That the operator's rules are enough is proven by every other integration test: they all run
the operator as this ServiceAccount.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cozygpu.api import kinds
from cozygpu.api.names import API_VERSION
from cozygpu.devcluster import identity
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import Forbidden, Kube
from tests.support.bodies import gpu_device_body
from tests.support.harness import OperatorProcess, wait_for
from tests.support.nodes import Gpu, GPUNodeFactory

pytestmark = pytest.mark.integration


def forbidden(action: object) -> bool:
    try:
        action()  # type: ignore[operator]
    except Forbidden:
        return True
    return False


def test_the_operator_is_its_service_account_and_not_an_administrator(as_operator: Kube) -> None:
    """It authenticates as cozy-gpu-system/cozy-gpu-operator, outside system:masters; what it needs not, it may not."""
    assert as_operator.whoami() == identity.USERNAME
    assert forbidden(lambda: as_operator.delete(kinds.NODE, "any"))
    assert forbidden(lambda: as_operator.list(kinds.kind("ClusterRole")))
    assert forbidden(
        lambda: as_operator.create(
            kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "nope"}}
        )
    )


def tenant(plane: ControlPlane, kube: Kube, namespace: str, role: str, directory: Path) -> Kube:
    """A user who holds `role` in the namespace only, as a RoleBinding to the chart's ClusterRole gives it."""
    user = f"{role}-user"
    kube.create(
        kinds.kind("RoleBinding"),
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": role, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    )
    return Kube.from_kubeconfig(plane.write_kubeconfig(directory / role, user=user, group=None))


def test_a_tenant_who_edits_orders_and_releases_devices_but_never_writes_status_or_budgets(
    admitting: OperatorProcess,
    control_plane: ControlPlane,
    kube: Kube,
    namespace: str,
    gpu: Gpu,
    gpu_node: GPUNodeFactory,
    tmp_path: Path,
) -> None:
    """cozy-gpu-tenant-edit: create, read, delete GPUDevices, read budgets; no status, budgets or other namespaces."""
    gpu_node({gpu.resource: 1}, name=f"rbac-{gpu.cls}")
    alice = tenant(control_plane, kube, namespace, "cozy-gpu-tenant-edit", tmp_path)
    alice.create(kinds.GPU_DEVICE, gpu_device_body("mine", namespace, gpu.cls))
    wait_for("bound", lambda: alice.get(kinds.GPU_DEVICE, "mine", namespace).get("status", {}).get("phase") == "Bound")
    assert alice.list(kinds.GPU_BUDGET, namespace) == []
    body = alice.get(kinds.GPU_DEVICE, "mine", namespace)
    body["status"]["nodeName"] = "somewhere-else"
    assert forbidden(lambda: alice.replace_status(kinds.GPU_DEVICE, body))
    budget = {
        "apiVersion": API_VERSION,
        "kind": "GPUBudget",
        "metadata": {"name": "mine", "namespace": namespace},
        "spec": {"total": 100},
    }
    assert forbidden(lambda: alice.create(kinds.GPU_BUDGET, budget))
    assert forbidden(lambda: alice.list(kinds.GPU_DEVICE, "default"))
    assert alice.delete(kinds.GPU_DEVICE, "mine", namespace)


def test_a_tenant_who_views_reads_devices_and_budgets_and_nothing_more(
    control_plane: ControlPlane, kube: Kube, namespace: str, gpu: Gpu, tmp_path: Path
) -> None:
    """cozy-gpu-tenant-view: get and list; no create, no delete."""
    bob = tenant(control_plane, kube, namespace, "cozy-gpu-tenant-view", tmp_path)
    assert bob.list(kinds.GPU_DEVICE, namespace) == []
    assert bob.list(kinds.GPU_BUDGET, namespace) == []
    assert forbidden(lambda: bob.create(kinds.GPU_DEVICE, gpu_device_body("x", namespace, gpu.cls)))
    assert forbidden(lambda: bob.delete(kinds.GPU_DEVICE, "x", namespace))
