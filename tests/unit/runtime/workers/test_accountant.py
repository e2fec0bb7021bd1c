"""The accountant (§1.3, §1.1) driven through the view and the one writer, against the in-memory API.

GPUNodes made, adopted and deleted, class status kept current; every write goes through the
writer, so each outcome (LANDED, CONFLICT, GONE) reaches the accountant as one `Outcome`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

from cozygpu.api import kinds
from cozygpu.api.meta import now
from cozygpu.api.names import API_VERSION
from cozygpu.runtime.view import View
from cozygpu.runtime.workers.accountant import Accountant
from tests.support.memkube import MemKube
from tests.support.views import A10, budget, device, gpu_class, node
from tests.support.workers import run_until
from tests.support.writing import NS, writer

Body = dict[str, Any]


def _accountant() -> tuple[Accountant, View, MemKube]:
    w, view, kube = writer()
    accountant = Accountant(view.cluster, w)
    view.subscribe(accountant.changed)
    return accountant, view, kube


def _serving(view: View, kube: MemKube) -> Body:
    """Node n1 with 8 A10s, class a10 of that resource: n1 serves a10 (§8)."""
    view.apply(kinds.NODE, node("n1", {A10: 8}))
    cls = kube.put(kinds.GPU_CLASS, gpu_class("a10"))
    view.apply(kinds.GPU_CLASS, cls)
    return cls


def _gpunode(kube: MemKube) -> Body | None:
    return kube.stored(kinds.GPU_NODE, "n1")


def _resources(body: Body | None) -> dict[str, tuple[int, int]]:
    rows = ((body or {}).get("status") or {}).get("resources") or []
    return {r["name"]: (r["allocatable"], r["held"]) for r in rows}


def test_a_node_that_starts_serving_a_class_gets_a_gpunode_with_its_units() -> None:
    """§1.3: created, then its status written: the node's allocatable A10s, none held; the view holds it."""
    accountant, view, kube = _accountant()
    _serving(view, kube)
    assert asyncio.run(run_until(accountant.run, lambda: _resources(_gpunode(kube)) == {A10: (8, 0)}))
    held = view.cluster.gpunodes.get("n1")
    assert held is not None and held.status.classes == ["a10"]


def test_a_gpunode_made_meanwhile_is_adopted_not_made_again() -> None:
    """A create of a taken name is a CONFLICT: the accountant writes the status of the GPUNode already there."""
    accountant, view, kube = _accountant()
    _serving(view, kube)
    there = kube.put(kinds.GPU_NODE, {"apiVersion": API_VERSION, "kind": "GPUNode", "metadata": {"name": "n1"}})
    assert asyncio.run(run_until(accountant.run, lambda: _resources(_gpunode(kube)) == {A10: (8, 0)}))
    api = _gpunode(kube)
    assert api is not None and api["metadata"]["uid"] == there["metadata"]["uid"]
    assert kube.count("create") == 1


def test_a_gpunode_status_that_loses_a_race_is_written_on_the_winners_version_at_once() -> None:
    """Issue 35 item 3: a GPUNode's status write that lost is decided again on the winner's version in the same
    look at the node (`Writer.update`), not put off to a retry a second later."""
    accountant, view, kube = _accountant()
    _serving(view, kube)
    there = kube.put(kinds.GPU_NODE, {"apiVersion": API_VERSION, "kind": "GPUNode", "metadata": {"name": "n1"}})
    view.apply(kinds.GPU_NODE, there)
    labelled = {**there, "metadata": {**there["metadata"], "labels": {"team": "a"}}}
    kube.before_next("replace_status", lambda: kube.change(kinds.GPU_NODE, labelled))
    asyncio.run(accountant._sync("n1"))  # one look
    api = _gpunode(kube)
    assert _resources(api) == {A10: (8, 0)} and api is not None and api["metadata"]["labels"] == {"team": "a"}
    assert kube.count("replace_status") == 2


def test_a_gpunode_whose_node_serves_nothing_is_deleted_and_forgotten() -> None:
    """§1.3: nothing left to say (no node, no device on it): deleted under its uid, and the view forgets it at once."""
    accountant, view, kube = _accountant()
    body = kube.put(kinds.GPU_NODE, {"apiVersion": API_VERSION, "kind": "GPUNode", "metadata": {"name": "n1"}})
    view.apply(kinds.GPU_NODE, body)
    assert asyncio.run(run_until(accountant.run, lambda: _gpunode(kube) is None))
    assert "n1" not in view.cluster.gpunodes


def test_a_class_counts_the_units_its_bound_devices_hold() -> None:
    """§1.1: a device of the class Bound on n1 with 2 units: the class's status says 2 held of 8."""
    accountant, view, kube = _accountant()
    _serving(view, kube)
    view.apply(kinds.GPU_DEVICE, device("d", count=2, namespace=NS, phase="Bound", node_name="n1"))

    def counted() -> bool:
        status = (kube.stored(kinds.GPU_CLASS, "a10") or {}).get("status") or {}
        return status.get("held") == 2 and status.get("allocatable") == 8

    assert asyncio.run(run_until(accountant.run, counted))


def test_a_class_status_that_loses_a_race_is_written_again_on_the_winners_version() -> None:
    """A CONFLICT on the class's status: the writer read the winner into the view and the accountant writes on it,
    keeping the winner's change."""
    accountant, view, kube = _accountant()
    cls = _serving(view, kube)
    labelled = {**cls, "metadata": {**cls["metadata"], "labels": {"team": "a"}}}
    kube.before_next("replace_status", lambda: kube.change(kinds.GPU_CLASS, labelled))

    def written() -> bool:
        api = kube.stored(kinds.GPU_CLASS, "a10") or {}
        return (api.get("status") or {}).get("allocatable") == 8

    assert asyncio.run(run_until(accountant.run, written))
    api = kube.stored(kinds.GPU_CLASS, "a10")
    assert api is not None and api["metadata"]["labels"] == {"team": "a"}
    assert kube.count("replace_status") >= 2


def test_an_order_whose_device_never_came_leaves_its_budget_when_it_expires_with_nothing_else_happening() -> None:
    """§7.4: a budget's record shows an order in flight; its device never comes and no event touches the budget
    again: the accountant still takes it off when it expires, so `kubectl get gpubudget` shows it no longer."""
    accountant, view, kube = _accountant()
    expires = (now() + dt.timedelta(seconds=0.3)).isoformat()
    order = {"namespace": NS, "name": "x", "uid": "u", "className": "a10", "count": 1, "expires": expires}
    body = budget("b", namespace=NS, limits={"a10": 2})
    body["metadata"].pop("resourceVersion")
    stored = kube.put(kinds.GPU_BUDGET, {"apiVersion": API_VERSION, "kind": "GPUBudget", **body})
    stored = kube.change(kinds.GPU_BUDGET, {**stored, "status": {"orders": [order], "orderedTotal": 1}}, status=True)
    view.apply(kinds.GPU_BUDGET, stored)

    def emptied() -> bool:
        status = (kube.stored(kinds.GPU_BUDGET, "b", NS) or {}).get("status") or {}
        return status.get("orders") == [] and status.get("orderedTotal") == 0

    assert asyncio.run(run_until(accountant.run, emptied))
