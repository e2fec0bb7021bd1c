"""§7.4, §14: one tenant filling the order ledger, the one ConfigMap where every budgeted order of every tenant meets.

Mallory's namespace is at its ResourceQuota's object count for GPUDevices, so each of her creates passes the
operator's webhook, which records its order in the ledger, and is then refused by the quota, which the API server
checks after the webhooks: the device never comes, and its entry stays until it expires. With names of 253
characters, some 2,700 such creates took the ledger past the API server's 1 MiB for a ConfigMap's data; from then on
every ledger write failed, and with it every tenant's create under a budget.
"""

from __future__ import annotations

import concurrent.futures
import time

import pytest

from cozygpu.api import kinds
from cozygpu.api.kinds import Kind
from cozygpu.devcluster.harness import OperatorProcess, wait_for
from cozygpu.kube.adapter import ApiError, Kube
from cozygpu.runtime.ledger import CONFIG_MAP, NAME
from tests.support.bodies import budget_body, gpu_device_body
from tests.support.invariants import assert_invariants
from tests.support.nodes import Gpu, GPUNodeFactory
from tests.support.tenants import Tenant

pytestmark = [pytest.mark.integration, pytest.mark.adversarial]

QUOTA = Kind("v1", "ResourceQuota", "resourcequotas", True)
COUNT = "count/gpudevices.gpu.cozystack.io"
FLOOD = 3200  # past 1 MiB of names alone, within the 30 s an entry of a device that never came stays
VICTIM = 10  # the victim's creates, one after another while the flood goes on


def _ledger_bytes(kube: Kube) -> int:
    ledger = next((c for c in kube.list(CONFIG_MAP) if c["metadata"]["name"] == NAME), None) or {}
    return sum(len(k) + len(v) for k, v in (ledger.get("data") or {}).items())


def test_a_tenant_flooding_creates_its_quota_refuses_cannot_fill_the_ledger_for_another(
    admitting: OperatorProcess, kube: Kube, mallory: Tenant, victim: Tenant, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """Mallory floods creates that her quota refuses after admission; past the ledger's room for held orders the
    operator refuses hers itself, naming her namespace; the ledger stays under 1 MiB, and every create the victim
    makes under a budget meanwhile is admitted (before the fix, once the flood had the ledger at its limit, the
    victim's creates failed with hers)."""
    gpu_node({gpu.resource: 8}, name=f"flood-{gpu.cls}")
    for tenant in (mallory, victim):
        kube.create(kinds.GPU_BUDGET, budget_body(tenant.namespace, total=100_000))
    kube.create(
        QUOTA,
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "devices", "namespace": mallory.namespace},
            "spec": {"hard": {COUNT: "0"}},
        },
    )
    quota = kube.get(QUOTA, "devices", mallory.namespace)  # no quota controller runs here: its status, as it writes it
    quota["status"] = {"hard": {COUNT: "0"}, "used": {COUNT: "0"}}
    kube.replace_status(QUOTA, quota)

    def create(i: int) -> str:
        name = f"f{i:05d}-" + "x" * 246  # 253 characters, the longest name
        try:
            mallory.kube.create(kinds.GPU_DEVICE, gpu_device_body(name, mallory.namespace, gpu.cls, 1))
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

    wait_for("the budgets in the view", lambda: "exceeded quota" in create(-1))
    try:
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            flood = pool.map(create, range(FLOOD))
            mine = [victim_creates(i) for i in range(VICTIM)]  # while the flood goes on
            answers = list(flood)
        assert mine == ["created"] * VICTIM, next(a for a in mine if a != "created")
        by_quota = sum("exceeded quota" in a for a in answers)
        by_share = sum(f"namespace {mallory.namespace} has" in a and "more than its share" in a for a in answers)
        assert by_quota > 0 and by_share > 0 and by_quota + by_share == FLOOD, {a[:120] for a in answers}
        assert _ledger_bytes(kube) < 1024 * 1024
        assert kube.list(kinds.GPU_DEVICE, mallory.namespace) == []
        assert_invariants(kube, (mallory, victim), admitting)
    finally:
        # The flood's entries would stay 30 s in the session's ledger; the test's own operator is its only writer.
        for ledger in (c for c in kube.list(CONFIG_MAP) if c["metadata"]["name"] == NAME):
            kube.delete(CONFIG_MAP, NAME, ledger["metadata"]["namespace"])
        kube.delete(QUOTA, "devices", mallory.namespace)
