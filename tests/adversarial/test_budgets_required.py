"""Issue 19 item 6 (§7): with `--budgets-required`, a namespace no GPUBudget covers orders nothing.

Without it, a tenant whose namespace the platform gave no budget may order every free GPU of
the cluster; with it, mallory's orders are refused whichever way she makes them, and she cannot
give herself a budget, while the victim orders within its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cozygpu.api import kinds
from cozygpu.devcluster.bodies import vmi_body
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import ApiError, Forbidden, Kube
from tests.support.bodies import budget_body, gpu_device_body
from tests.support.harness import OperatorProcess
from tests.support.invariants import assert_invariants
from tests.support.nodes import Gpu, GPUNodeFactory
from tests.support.objects import held
from tests.support.operators import start_admitting_operator, unregister_webhooks
from tests.support.tenants import Tenant

pytestmark = [pytest.mark.integration, pytest.mark.adversarial]

REFUSAL = "has no GPUBudget, and this cluster requires one"


@pytest.fixture(scope="module")
def strict(
    control_plane: ControlPlane, operator_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """The operator with its webhooks and --budgets-required."""
    process = start_admitting_operator(
        operator_kubeconfig, tmp_path_factory.mktemp("strict"), "--bind-timeout", "5", "--budgets-required"
    )
    yield process
    process.stop()
    unregister_webhooks(control_plane.kube())


def test_a_namespace_without_a_budget_orders_nothing_where_budgets_are_required(
    strict: OperatorProcess, kube: Kube, mallory: Tenant, victim: Tenant, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """§7: mallory's namespace has no budget: her held device and her VMI's template device are refused naming
    the rule, and her tenant role may not create a budget; the victim, whose namespace has one, orders both."""
    gpu_node({gpu.resource: 8}, name=f"strict-{gpu.cls}")
    kube.create(kinds.GPU_BUDGET, budget_body(victim.namespace, total=4))
    ns, refs = mallory.namespace, [{"deviceTemplate": {"className": gpu.cls, "count": 1}}]
    with pytest.raises(ApiError) as raised:
        mallory.kube.create(kinds.GPU_DEVICE, gpu_device_body("mine", ns, gpu.cls))
    assert raised.value.status == 403 and REFUSAL in raised.value.message, raised.value.message
    with pytest.raises(ApiError) as raised:
        mallory.kube.create(kinds.VMI, vmi_body("v", ns, refs))
    assert raised.value.status == 403 and REFUSAL in raised.value.message, raised.value.message
    with pytest.raises(Forbidden):
        mallory.kube.create(kinds.GPU_BUDGET, budget_body(ns, total=100))
    assert mallory.kube.list(kinds.GPU_DEVICE, ns) == []
    held(victim.kube, victim.namespace, "theirs", gpu.cls)
    admitted = victim.kube.create(kinds.VMI, vmi_body("v", victim.namespace, refs))
    assert admitted["spec"]["domain"]["devices"]["gpus"] == [{"name": "gpudev0-0", "deviceName": gpu.resource}]
    assert_invariants(kube, (mallory, victim), strict)
