"""§7.4 across replicas for template orders (issues 21 and 36): the leader's binder and another replica's held-device
webhook count each other's orders through the budget both charge them to, whichever writes first."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest

from cozygpu.api import kinds
from cozygpu.api.meta import now
from cozygpu.runtime import breath, charges
from cozygpu.runtime.admission.outcomes import Refusal
from cozygpu.runtime.admission.reservations import Reservations
from cozygpu.runtime.admission.validation import Validation
from cozygpu.runtime.charges import Charges
from cozygpu.runtime.view import View
from cozygpu.runtime.workers.binder import Binder
from cozygpu.runtime.writes import Writer
from tests.support.memkube import MemKube
from tests.support.views import A10, budget, cluster, created, device, gpu_class, node, request
from tests.support.workers import run_until
from tests.support.writing import NS, writer

USER = "system:serviceaccount:t1:tenant"
LIMIT = 2
Body = dict[str, Any]


def _cap(kube: MemKube) -> Body:
    """The budget in the one API (a limit of LIMIT in t1), made once, as every replica's view lists it."""
    stored = kube.stored(kinds.GPU_BUDGET, "cap", NS)
    if stored is None:
        body = budget("cap", namespace=NS, limits={"a10": LIMIT})
        body["metadata"].pop("resourceVersion")
        stored = kube.put(kinds.GPU_BUDGET, {"apiVersion": "gpu.cozystack.io/v1alpha1", "kind": "GPUBudget", **body})
    return stored


def _leader(*, charges: bool = True) -> tuple[Binder, View, MemKube]:
    """The Lease holder's binder: its view (8 A10 units, a budget of LIMIT in t1) and the cluster's one API."""
    w, view, kube = writer()
    view.apply(kinds.NODE, node("n1", {A10: 8}))
    view.apply(kinds.GPU_CLASS, gpu_class("a10"))
    view.apply(kinds.GPU_BUDGET, _cap(kube))
    shared = Charges(view.cluster, w, 30) if charges else None
    binder = Binder(view.cluster, w, incomplete_after=30, concurrency=8, charges=shared)
    view.subscribe(binder.changed)
    return binder, view, kube


def _replica(kube: MemKube) -> Validation:
    """Another replica's device webhook: its own view, which has seen none of the leader's devices, nor the
    budget's record since it listed it."""
    view = cluster(nodes=[node("n1", {A10: 8})], classes=[gpu_class("a10")], budgets=[_cap(kube)])
    reservations = Reservations(ttl=30)
    charges = Charges(view, Writer(View(view), kube), 30, mine=reservations.holds_device)
    return Validation(view, reservations, charges=charges)


def _held(replica: Validation, name: str) -> bool:
    async def create() -> bool:
        try:
            await replica.device("CREATE", created(name), None, USER, False, review=f"review-{name}")
        except Refusal:
            return False
        return True

    return asyncio.run(create())


def _template_set(view: View, kube: MemKube, name: str, at: dt.datetime) -> None:
    """A template device admitted with its VMI and carrying the VMI's bind request (§4), in the API and the view."""
    body = device(name, template=True, status=request(f"r-{name}", f"vm-{name}", [name], at))
    status = body.pop("status")
    body["metadata"].pop("resourceVersion")
    stored = kube.put(kinds.GPU_DEVICE, body)
    view.apply(kinds.GPU_DEVICE, kube.change(kinds.GPU_DEVICE, {**stored, "status": status}, status=True))


def _result(kube: MemKube, name: str) -> Body:
    status = (kube.stored(kinds.GPU_DEVICE, name, NS) or {}).get("status") or {}
    answer = status.get("bindRequest") or {}
    return {"phase": status.get("phase"), "status": answer.get("result"), "message": answer.get("message") or ""}


def _answered(binder: Binder, kube: MemKube, *names: str) -> list[Body]:
    assert asyncio.run(run_until(binder.run, lambda: all(_result(kube, n)["status"] for n in names)))
    return [_result(kube, n) for n in names]


def test_a_template_bind_counts_the_held_creates_another_replica_admitted() -> None:
    """Another replica admitted two held units the leader's view has not seen: the leader's template bind of a third
    is refused with the budget named, not bound (without the charges it was bound: 3 units against 2)."""
    binder, view, kube = _leader()
    b = _replica(kube)
    assert _held(b, "h1") and _held(b, "h2")
    _template_set(view, kube, "t", now())
    [answer] = _answered(binder, kube, "t")
    assert answer["status"] == "Failed" and answer["phase"] != "Bound", answer
    assert "GPUBudget t1/cap" in answer["message"], answer
    assert view.cluster.budgets.use(NS, "cap").get("a10", 0) == 0  # taken back in the view too: nothing held


def test_without_charges_the_leader_binds_past_the_budget() -> None:
    """The gap the charges close for template orders (the test above fails so)."""
    binder, view, kube = _leader(charges=False)
    b = _replica(kube)
    assert _held(b, "h1") and _held(b, "h2")
    _template_set(view, kube, "t", now())
    [answer] = _answered(binder, kube, "t")
    assert answer["phase"] == "Bound"


def test_held_devices_that_reach_the_view_between_decision_and_charge_take_the_bind_back() -> None:
    """Another replica's two held units arrive in the leader's view after its binder decided a template bind and
    before its charge lands (which conflicts, and decides again), and their orders count in the view, not from the
    budget's record: the bind is still refused (3 units against 2 otherwise)."""
    binder, view, kube = _leader()
    b = _replica(kube)
    assert _held(b, "h1") and _held(b, "h2")

    def arrive() -> None:
        for name in ("h1", "h2"):
            body = device(name)
            body["metadata"].pop("resourceVersion")
            view.apply(kinds.GPU_DEVICE, kube.put(kinds.GPU_DEVICE, body))

    kube.before_next("replace_status", arrive)  # the binder's first write: the charge, on the version it listed
    _template_set(view, kube, "t", now())
    [answer] = _answered(binder, kube, "t")
    assert answer["status"] == "Failed", answer
    assert view.cluster.budgets.use(NS, "cap").get("a10", 0) == LIMIT


def test_a_held_create_on_another_replica_counts_the_leaders_template_bind() -> None:
    """The leader bound a template device its peer's view has not seen Bound: the peer admits one more held unit
    against the limit of 2, not two."""
    binder, view, kube = _leader()
    _template_set(view, kube, "t", now())
    [answer] = _answered(binder, kube, "t")
    assert answer["phase"] == "Bound"
    b = _replica(kube)
    assert [_held(b, "h1"), _held(b, "h2")] == [True, False]


def _two_binds_with_one_unit_held_elsewhere() -> list[Body]:
    """One held unit admitted on another replica; template binds `first` and, a second later, `later`, of one unit
    each against LIMIT (2): their answers."""
    binder, view, kube = _leader()
    assert _held(_replica(kube), "h1")
    start = now()
    _template_set(view, kube, "first", start)
    _template_set(view, kube, "later", start + dt.timedelta(seconds=1))
    return _answered(binder, kube, "first", "later")


def test_of_two_binds_the_newest_gives_way() -> None:
    """One held unit admitted elsewhere, two template binds of one unit each against a limit of 2: the bind asked
    for first is bound, the later one refused."""
    first, later = _two_binds_with_one_unit_held_elsewhere()
    assert (first["phase"], later["status"]) == ("Bound", "Failed"), (first, later)


def test_the_newest_bind_gives_way_even_when_the_oldest_is_charged_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The binder hands the loop back between the two decisions, so the budget's moment holds the oldest bind alone
    while the newest is already counted in the view: the newest still gives way (the oldest was refused so, now and
    then, when a pass ran long)."""
    monkeypatch.setattr(breath, "HELD_MOST", 0.0)  # a pass hands the loop back before every request
    first, later = _two_binds_with_one_unit_held_elsewhere()
    assert (first["phase"], later["status"]) == ("Bound", "Failed"), (first, later)


def test_a_bind_under_no_budget_writes_no_budget() -> None:
    """Only orders a budget can refuse are charged: a namespace no budget covers binds without a budget write."""
    binder, view, kube = _leader()
    view.apply(kinds.GPU_BUDGET, _cap(kube), deleted=True)
    _template_set(view, kube, "t", now())
    [answer] = _answered(binder, kube, "t")
    assert answer["phase"] == "Bound"
    assert [m for m, kind, _ in kube.calls if kind == "GPUBudget"] == []


def test_a_bind_charged_to_its_budget_is_recorded_there() -> None:
    """The leader's bind is on the budget's record before its answer is written, under its device's uid."""
    binder, view, kube = _leader()
    _template_set(view, kube, "t", now())
    [answer] = _answered(binder, kube, "t")
    orders = ((kube.stored(kinds.GPU_BUDGET, "cap", NS) or {}).get("status") or {}).get("orders") or []
    assert answer["phase"] == "Bound" and [(o["name"], o["count"]) for o in orders] == [("t", 1)]
    assert orders[0]["uid"] == (kube.stored(kinds.GPU_DEVICE, "t", NS) or {})["metadata"]["uid"]


def test_a_bind_its_budget_cannot_record_is_refused_not_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A budget recording the most orders it holds refuses the leader's template bind too: taken back in the view and
    answered Failed with the budget named, not left Bound (the refusal came from the charge, not the bind's check)."""
    monkeypatch.setattr(charges, "RECORD_MOST", 0)
    binder, view, kube = _leader()
    _template_set(view, kube, "t", now())
    [answer] = _answered(binder, kube, "t")
    assert answer["status"] == "Failed" and answer["phase"] != "Bound", answer
    assert "GPUBudget t1/cap has 0 orders not yet counted" in answer["message"], answer
    assert view.cluster.budgets.use(NS, "cap").get("a10", 0) == 0
