"""The retired order ledger (§7.4 before issue 36): what a replica starting takes over from it.

Versions before issue 36 recorded every order in one ConfigMap, `cozy-gpu-orders`. A replica
starting takes over what it still holds (`take_over_ledger`); runtime.charges counts those orders
until they expire. It leaves the ConfigMap where an older replica cannot write it (immutable, and
the chart's Role no longer lets it update it): in a rolling upgrade an older replica's budgeted
orders fail closed instead of being recorded where no newer replica looks. Caller:
runtime.process.app, at start-up.
"""

from __future__ import annotations

import datetime as dt
import json

import structlog

from cozygpu.api import kinds
from cozygpu.api.gpubudget import BudgetOrder
from cozygpu.kube.adapter import AlreadyExists, ApiError, AsyncKube
from cozygpu.runtime.writes import Body

log = structlog.get_logger("cozygpu.charges")

LEDGER = "cozy-gpu-orders"  # the retired order ledger's ConfigMap, in the operator's namespace
CONFIG_MAP = kinds.kind("ConfigMap")


async def take_over_ledger(kube: AsyncKube, namespace: str) -> list[BudgetOrder]:
    """The orders the retired ledger still holds, to count until they expire; where there is none, an immutable
    empty one takes its place, so an older replica's create of it fails (closed) as its update does."""
    for _ in range(3):
        try:
            body = await kube.get_or_none(CONFIG_MAP, LEDGER, namespace)
            if body is not None:
                return _ledger_orders(body)
            await kube.create(CONFIG_MAP, _tombstone(namespace))
            return []
        except AlreadyExists:
            continue  # an older replica made it a moment ago: read what it holds
        except ApiError as e:  # a chart without the Role's read of it: nothing older ran here
            log.warning("charges.ledger_unread", namespace=namespace, error=e.message)
            return []
    return []


def _tombstone(namespace: str) -> Body:
    why = "The order ledger is retired: orders are charged to GPUBudget status (§7.4). Safe to delete once no"
    why += " replica of an older cozy-gpu-operator runs."
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": LEDGER, "namespace": namespace, "annotations": {"gpu.cozystack.io/retired": why}},
        "immutable": True,
    }


def _ledger_orders(body: Body) -> list[BudgetOrder]:
    """The retired ledger's entries as orders; what does not parse is skipped (it was never ours to read)."""
    out = []
    for raw in (body.get("data") or {}).values():
        try:
            v = json.loads(raw)
            out.append(
                BudgetOrder(
                    namespace=str(v["namespace"]),
                    name=str(v["name"]),
                    uid=str(v.get("uid") or ""),
                    class_name=str(v["class"]),
                    count=int(v["count"]),
                    expires=dt.datetime.fromtimestamp(float(v["expires"]), dt.UTC),
                )
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return out
