"""§7.4 across replicas for template orders (issue 21 item 3): the leader's binder and another replica's held-device
webhook count each other's orders through the one order ledger, whichever writes first."""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from typing import Any

from cozygpu.api import kinds
from cozygpu.api.meta import now
from cozygpu.decisions.budgets import Order
from cozygpu.runtime.admission.outcomes import Refusal
from cozygpu.runtime.admission.reservations import Reservations
from cozygpu.runtime.admission.validation import Validation
from cozygpu.runtime.ledger import CONFIG_MAP, NAME, SETTLE, Ledger
from cozygpu.runtime.view import View
from cozygpu.runtime.workers.binder import Binder
from tests.support.memkube import MemKube
from tests.support.views import A10, budget, cluster, created, device, gpu_class, node, request
from tests.support.workers import run_until
from tests.support.writing import NS, writer

OPS = "cozy-gpu-system"
USER = "system:serviceaccount:t1:tenant"
LIMIT = 2
Body = dict[str, Any]


def _leader(*, ledger: bool = True) -> tuple[Binder, View, MemKube]:
    """The Lease holder's binder: its view (8 A10 units, a budget of LIMIT in t1) and the cluster's one API."""
    w, view, kube = writer()
    view.apply(kinds.NODE, node("n1", {A10: 8}))
    view.apply(kinds.GPU_CLASS, gpu_class("a10"))
    view.apply(kinds.GPU_BUDGET, budget("cap", namespace=NS, limits={"a10": LIMIT}))
    shared = Ledger(kube, OPS, 30, view.cluster) if ledger else None
    binder = Binder(view.cluster, w, incomplete_after=30, concurrency=8, ledger=shared)
    view.subscribe(binder.changed)
    return binder, view, kube


def _replica(kube: MemKube) -> Validation:
    """Another replica's device webhook: its own view, which has seen none of the leader's devices."""
    view = cluster(
        nodes=[node("n1", {A10: 8})],
        classes=[gpu_class("a10")],
        budgets=[budget("cap", namespace=NS, limits={"a10": LIMIT})],
    )
    reservations = Reservations(ttl=30)
    return Validation(view, reservations, ledger=Ledger(kube, OPS, 30, view, mine=reservations.holds_device))


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
    is refused with the budget named, not bound (without the ledger it was bound: 3 units against 2)."""
    binder, view, kube = _leader()
    b = _replica(kube)
    assert _held(b, "h1") and _held(b, "h2")
    _template_set(view, kube, "t", now())
    [answer] = _answered(binder, kube, "t")
    assert answer["status"] == "Failed" and answer["phase"] != "Bound", answer
    assert "GPUBudget t1/cap" in answer["message"], answer
    assert view.cluster.budget_use(NS, "cap").get("a10", 0) == 0  # taken back in the view too: nothing held


def test_without_the_ledger_the_leader_binds_past_the_budget() -> None:
    """The gap the ledger closes for template orders (the test above fails so)."""
    binder, view, kube = _leader(ledger=False)
    b = _replica(kube)
    assert _held(b, "h1") and _held(b, "h2")
    _template_set(view, kube, "t", now())
    [answer] = _answered(binder, kube, "t")
    assert answer["phase"] == "Bound"


def test_held_devices_that_reach_the_view_between_decision_and_ledger_take_the_bind_back() -> None:
    """Another replica's two held units arrive in the leader's view after its binder decided a template bind and
    before the ledger read, and their entries count in the view, not from the ledger: the bind is still refused
    (the overrun was looked for only among the ledger's entries, and the bind landed: 3 units against 2)."""
    binder, view, kube = _leader()
    b = _replica(kube)
    assert _held(b, "h1") and _held(b, "h2")

    def arrive() -> None:
        for name in ("h1", "h2"):
            body = device(name)
            body["metadata"].pop("resourceVersion")
            view.apply(kinds.GPU_DEVICE, kube.put(kinds.GPU_DEVICE, body))

    kube.before_next("get", arrive)  # the binder's first read of the ledger
    _template_set(view, kube, "t", now())
    [answer] = _answered(binder, kube, "t")
    assert answer["status"] == "Failed", answer
    assert view.cluster.budget_use(NS, "cap").get("a10", 0) == LIMIT


def test_a_held_create_on_another_replica_counts_the_leaders_template_bind() -> None:
    """The leader bound a template device its peer's view has not seen Bound: the peer admits one more held unit
    against the limit of 2, not two."""
    binder, view, kube = _leader()
    _template_set(view, kube, "t", now())
    [answer] = _answered(binder, kube, "t")
    assert answer["phase"] == "Bound"
    b = _replica(kube)
    assert [_held(b, "h1"), _held(b, "h2")] == [True, False]


def test_of_two_binds_the_newest_gives_way() -> None:
    """One held unit admitted elsewhere, two template binds of one unit each against a limit of 2: the bind asked
    for first is bound, the later one refused."""
    binder, view, kube = _leader()
    assert _held(_replica(kube), "h1")
    start = now()
    _template_set(view, kube, "first", start)
    _template_set(view, kube, "later", start + dt.timedelta(seconds=1))
    first, later = _answered(binder, kube, "first", "later")
    assert (first["phase"], later["status"]) == ("Bound", "Failed"), (first, later)


def test_a_bind_under_no_budget_writes_no_ledger() -> None:
    """Only orders a budget can refuse meet in the ledger: a namespace no budget covers binds without it."""
    binder, view, kube = _leader()
    view.apply(kinds.GPU_BUDGET, budget("cap", namespace=NS, limits={"a10": LIMIT}), deleted=True)
    _template_set(view, kube, "t", now())
    [answer] = _answered(binder, kube, "t")
    assert answer["phase"] == "Bound" and kube.stored(CONFIG_MAP, NAME, OPS) is None


def test_an_entry_stays_until_every_replica_has_had_time_to_see_it() -> None:
    """A writer whose view counts a device keeps its entry for SETTLE seconds (a peer's watch may be behind), then
    drops it at its next write."""
    kube = MemKube()
    view = cluster(classes=[gpu_class("a10")], budgets=[budget("cap", namespace=NS, limits={"a10": 8})])
    clock = [1000.0]
    ledger = Ledger(kube, OPS, 30, view, clock=lambda: clock[0])

    def record(name: str) -> list[str]:
        asyncio.run(ledger.admit(Order(NS, "a10", 1, name), name, f"uid-{NS}-{name}", lambda others: None))
        return sorted((kube.stored(CONFIG_MAP, NAME, OPS) or {}).get("data") or {})

    assert record("a") == ["t1.a"]
    clock[0] += 2 * SETTLE  # a slow create: the entry is old before any view counts its device
    View(view).apply(kinds.GPU_DEVICE, device("a"))  # this writer's view counts a now
    assert record("b") == ["t1.a", "t1.b"]  # kept: counted only now (it went at once when timed from its write)
    clock[0] += SETTLE / 2
    assert record("c") == ["t1.a", "t1.b", "t1.c"]
    clock[0] += SETTLE / 2
    assert record("d") == ["t1.b", "t1.c", "t1.d"]


def test_a_ledger_key_stays_a_valid_configmap_key_however_long_the_name() -> None:
    """§14: a name of 253 characters in a long namespace would make a key the API server refuses (at most 253),
    failing every write with it, other tenants' orders in the same write too; its key is a digest instead."""
    kube = MemKube()
    long_ns, long_name = "n" * 63, "d" * 253
    view = cluster(classes=[gpu_class("a10")], budgets=[budget("cap", namespace=long_ns, limits={"a10": 8})])
    ledger = Ledger(kube, OPS, 30, view)
    asyncio.run(ledger.admit(Order(long_ns, "a10", 1, long_name), long_name, "u1", lambda others: None))
    asyncio.run(ledger.admit(Order(NS, "a10", 1, "short"), "short", "u2", lambda others: None))
    data = (kube.stored(CONFIG_MAP, NAME, OPS) or {}).get("data") or {}
    assert len(data) == 2 and all(len(k) <= 253 and re.fullmatch(r"[-._a-zA-Z0-9]+", k) for k in data), list(data)
    assert "t1.short" in data


def test_an_order_whose_device_this_view_saw_go_counts_no_more() -> None:
    """A bind or create recorded, its device counted, then deleted (a VMI gone, a leader killed before its answer):
    a replica that saw the deletion counts the entry no more, rather than until it expires (which refused the next
    VMI after a leader's kill in the replicas test)."""
    kube = MemKube()
    b = _replica(kube)
    assert _held(b, "h1") and _held(b, "h2")
    c = _replica(kube)
    cluster_of_c = c._cluster  # the replica's own view, fed as its watch would
    for name in ("h1", "h2"):
        body = device(name)
        body["metadata"]["resourceVersion"] = "1000000"
        View(cluster_of_c).apply(kinds.GPU_DEVICE, body)
        View(cluster_of_c).forget(kinds.GPU_DEVICE, NS, name, "1000001")
    assert [_held(c, "h3"), _held(c, "h4"), _held(c, "h5")] == [True, True, False]
