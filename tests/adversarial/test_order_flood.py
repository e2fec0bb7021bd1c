"""§7.4, §13.5, §14: one tenant flooding creates that never make a device, beside another tenant's creates.

Mallory's namespaces are each at their ResourceQuota's object count for GPUDevices, so each of her creates passes the
operator's webhook, which charges its order to her namespace's budget, and is then refused by the quota, which the
API server checks after the webhooks: the device never comes, and its order stays charged until it expires. Through
the one order ledger of issue 21 (one ConfigMap every budgeted order of every tenant wrote), such a flood with names
of 253 characters once took the ledger past the API server's 1 MiB and failed every tenant's budgeted create; then,
bounded by shares, the ledger's room was still one for every tenant. Charged to the budgets they spend, her orders
only fill her own, each at most RECORD_MOST orders, and no object that other tenants' orders write grows with them.
"""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path

import pytest

from cozygpu.api import kinds
from cozygpu.api.kinds import Kind
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import ApiError, Kube
from cozygpu.runtime.charges import RECORD_MOST
from tests.support.bodies import budget_body, gpu_device_body
from tests.support.harness import OperatorProcess, wait_for
from tests.support.invariants import assert_invariants
from tests.support.nodes import Gpu, GPUNodeFactory
from tests.support.seen import budget_seen
from tests.support.tenants import Tenant, make_tenant

pytestmark = [pytest.mark.integration, pytest.mark.adversarial]

QUOTA = Kind("v1", "ResourceQuota", "resourcequotas", True)
COUNT = "count/gpudevices.gpu.cozystack.io"
FLOOD = 3200  # over her three namespaces: past the ledger's room for held orders with these names, within 30 s
VICTIM = 10  # the victim's creates, one after another while the flood goes on


def _quota_of_nothing(kube: Kube, namespace: str) -> None:
    body = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "devices", "namespace": namespace}}
    kube.create(QUOTA, {**body, "spec": {"hard": {COUNT: "0"}}})
    quota = kube.get(QUOTA, "devices", namespace)  # no quota controller runs here: its status, as it writes it
    quota["status"] = {"hard": {COUNT: "0"}, "used": {COUNT: "0"}}
    kube.replace_status(QUOTA, quota)


def test_a_tenant_flooding_creates_that_never_come_fills_only_its_own_budgets(
    admitting: OperatorProcess,
    control_plane: ControlPlane,
    kube: Kube,
    victim: Tenant,
    gpu: Gpu,
    gpu_node: GPUNodeFactory,
    tmp_path: Path,
) -> None:
    """Mallory, over three namespaces each under a budget of her own with room to spare, floods creates of the
    longest names that her quotas refuse after admission: each budget records at most RECORD_MOST orders, past
    which the operator refuses hers naming her budget; every create the victim makes under its own budget meanwhile
    is admitted; and she cannot write a budget's record."""
    gpu_node({gpu.resource: 8}, name=f"flood-{gpu.cls}")
    mallory = [make_tenant(control_plane, kube, "mallory", tmp_path) for _ in range(3)]
    for tenant in (*mallory, victim):
        kube.create(kinds.GPU_BUDGET, budget_body(tenant.namespace, total=100_000))
    for tenant in mallory:
        _quota_of_nothing(kube, tenant.namespace)
    for tenant in (*mallory, victim):
        budget_seen(kube, tenant.namespace, "cap")

    def create(i: int) -> str:
        tenant = mallory[i % len(mallory)]
        try:
            name = f"f{i:05d}-" + "x" * 246  # 253 characters, the longest name
            tenant.kube.create(kinds.GPU_DEVICE, gpu_device_body(name, tenant.namespace, gpu.cls, 1))
        except ApiError as e:
            return e.message
        return "created"

    def victim_creates(i: int) -> str:
        time.sleep(FLOOD / 100 / VICTIM)  # spread over the flood (it makes about 100 creates a second or more)
        try:
            victim.kube.create(kinds.GPU_DEVICE, gpu_device_body(f"mine-{i}", victim.namespace, gpu.cls, 1))
        except ApiError as e:
            return e.message[:300]
        return "created"

    wait_for("the quotas in force", lambda: all("exceeded quota" in create(-1 - i) for i in range(3)))
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        flood = pool.map(create, range(FLOOD))
        mine = [victim_creates(i) for i in range(VICTIM)]  # while the flood goes on
        answers = list(flood)
    assert mine == ["created"] * VICTIM, next(a for a in mine if a != "created")
    by_quota = sum("exceeded quota" in a for a in answers)
    by_budget = sum(f"GPUBudget {t.namespace}/cap has {RECORD_MOST} orders" in a for a in answers for t in mallory)
    assert by_quota > 0 and by_quota + by_budget == FLOOD, {a[:160] for a in answers}
    for tenant in mallory:
        status = kube.get(kinds.GPU_BUDGET, "cap", tenant.namespace).get("status") or {}
        assert len(status.get("orders") or []) <= RECORD_MOST
        assert tenant.kube.list(kinds.GPU_DEVICE, tenant.namespace) == []
    mine_budget = mallory[0].kube.get(kinds.GPU_BUDGET, "cap", mallory[0].namespace)
    mine_budget["status"] = {"orders": []}
    with pytest.raises(ApiError) as forbidden:
        mallory[0].kube.replace_status(kinds.GPU_BUDGET, mine_budget)  # her record is not hers to clear
    assert forbidden.value.status == 403, forbidden.value.message
    assert_invariants(kube, (*mallory, victim), admitting)
