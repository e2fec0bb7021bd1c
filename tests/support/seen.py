"""Waiting until the operator has seen an object: for what a test does next to be decided on it.

The API server has an object the moment its create returns; the operator's view hears of it a moment
later, through its watch. A test that waits on the API server races that event. These waits watch what
the operator writes from its view alone.
"""

from __future__ import annotations

from cozygpu.api import kinds
from cozygpu.api.names import CONDITION_OVER_BUDGET
from cozygpu.kube.adapter import Body, Kube
from tests.support.harness import wait_for


def budget_seen(kube: Kube, namespace: str, name: str, timeout: float = 20.0) -> Body:
    """Wait until the operator's view has the GPUBudget: its accountant has written the budget's status (units
    used and the OverBudget condition), which it computes from the budgets its view holds (§1.4, §7.3)."""

    def written() -> Body | None:
        body = kube.get_or_none(kinds.GPU_BUDGET, name, namespace)
        status = (body or {}).get("status") or {}
        conditions = {c.get("type") for c in status.get("conditions") or []}
        return body if "usedTotal" in status and CONDITION_OVER_BUDGET in conditions else None

    return wait_for(f"GPUBudget {namespace}/{name} seen by the operator", written, timeout=timeout)
