"""§7.4 across replicas (issue 36): held creates admitted by different replicas never together exceed a budget;
each order is charged to the budgets that can refuse it, under each one's resourceVersion, as ResourceQuota charges
its quotas, so tenants who share no budget share no write and a budget's own limits bound its record."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any, cast

import pytest

from cozygpu.api import GPUBudget, kinds
from cozygpu.api.gpubudget import BudgetOrder
from cozygpu.decisions.orders import Order
from cozygpu.kube.adapter import ApiError, AsyncKube, Conflict
from cozygpu.runtime import charges
from cozygpu.runtime.admission.outcomes import Refusal
from cozygpu.runtime.admission.reservations import Reservations
from cozygpu.runtime.admission.validation import Validation
from cozygpu.runtime.charges import CONFIG_MAP, LEDGER, Busy, Charges, take_over_ledger
from cozygpu.runtime.view import View
from cozygpu.runtime.writes import Writer
from cozygpu.state.cluster import Cluster
from tests.support.memkube import MemKube
from tests.support.views import A10, budget, cluster, created, device, gpu_class, node

OPS = "cozy-gpu-system"
USER = "system:serviceaccount:t1:tenant"
Body = dict[str, Any]


def _budgets(kube: MemKube, *bodies: Body) -> list[Body]:
    """The budgets in the one API, as every replica's view then lists them."""
    out = []
    for body in bodies:
        body["metadata"].pop("resourceVersion", None)
        out.append(kube.put(kinds.GPU_BUDGET, {"apiVersion": "gpu.cozystack.io/v1alpha1", "kind": "GPUBudget", **body}))
    return out


class _Replica:
    """One replica's device webhook over its own view, its own reservations and charges, and the cluster's API."""

    def __init__(
        self,
        kube: AsyncKube,
        budgets: list[Body],
        *,
        charges: bool = True,
        units: int = 8,
        namespaces: dict[str, dict[str, str]] | None = None,
        clock: Any = None,
    ) -> None:
        self.cluster: Cluster = cluster(
            nodes=[node("n1", {A10: units})], classes=[gpu_class("a10")], budgets=budgets, namespaces=namespaces or {}
        )
        self.view = View(self.cluster)
        self.reservations = Reservations(ttl=30)
        kw: dict[str, Any] = {"clock": clock} if clock is not None else {}
        self.charges = Charges(self.cluster, Writer(self.view, kube), 30, mine=self.reservations.holds_device, **kw)
        self.validation = Validation(self.cluster, self.reservations, charges=self.charges if charges else None)

    async def create(self, name: str, *, namespace: str = "t1", count: int = 1, uid: str | None = None) -> str:
        body = created(name, namespace=namespace, count=count, uid=uid)
        try:
            await self.validation.device("CREATE", body, None, USER, False, review=f"r-{namespace}-{name}-{uid}")
        except Refusal as e:
            return f"denied: {e}"
        except Exception:
            return "error"
        return "admitted"

    def sees(self, body: Body) -> None:
        """Its watch delivers a device."""
        self.view.apply(kinds.GPU_DEVICE, body)


def _admitted(replicas: list[_Replica], names: list[str]) -> list[str]:
    async def run() -> list[str]:
        return [n for i, n in enumerate(names) if await replicas[i % len(replicas)].create(n) == "admitted"]

    return asyncio.run(run())


def _record(kube: MemKube, name: str, namespace: str = "t1") -> list[BudgetOrder]:
    stored = kube.stored(kinds.GPU_BUDGET, name, namespace)
    assert stored is not None
    return GPUBudget.model_validate(stored).status.orders


def _writes(kube: MemKube, name: str | None = None) -> int:
    return sum(1 for m, kind, n in kube.calls if kind == "GPUBudget" and m == "replace_status" and name in (None, n))


# -- the guarantee across replicas -----------------------------------------------------------------------------


def test_creates_spread_over_two_replicas_stop_at_the_budget() -> None:
    """Neither replica's view has seen a device yet; charged to the budget, the third order of 1 unit against a
    limit of 2 is refused, wherever it lands (each replica alone would admit two)."""
    kube = MemKube()
    cap = _budgets(kube, budget("cap", limits={"a10": 2}))
    assert _admitted([_Replica(kube, cap), _Replica(kube, cap)], ["a", "b", "c", "d"]) == ["a", "b"]
    assert [e.name for e in _record(kube, "cap")] == ["a", "b"]


def test_without_charges_two_replicas_together_exceed_the_budget() -> None:
    """The gap the charges close: per-process reservations do not see each other (the test above fails so)."""
    kube = MemKube()
    cap = _budgets(kube, budget("cap", limits={"a10": 2}))
    pair = [_Replica(kube, cap, charges=False), _Replica(kube, cap, charges=False)]
    assert _admitted(pair, ["a", "b", "c", "d"]) == ["a", "b", "c", "d"]


def test_a_replica_that_loses_the_write_decides_again_with_the_winners_order() -> None:
    """Another replica charges b to the budget just before this one's write: this one's write conflicts, it reads
    the budget again, and its order no longer fits."""
    kube = MemKube()
    cap = _budgets(kube, budget("cap", limits={"a10": 2}))
    a = _Replica(kube, cap)
    assert asyncio.run(a.create("a")) == "admitted"

    def meanwhile() -> None:
        stored = kube.stored(kinds.GPU_BUDGET, "cap", "t1")
        assert stored is not None
        b = {
            "namespace": "t1",
            "name": "b",
            "uid": "ub",
            "className": "a10",
            "count": 1,
            "expires": "2099-01-01T00:00:00Z",
        }
        orders = [*stored["status"]["orders"], b]
        kube.change(kinds.GPU_BUDGET, {**stored, "status": {**stored["status"], "orders": orders}}, status=True)

    kube.before_next("replace_status", meanwhile)
    assert asyncio.run(a.create("c")).startswith("denied: GPUDevice c: GPUBudget t1/cap allows 2 units")
    assert [e.name for e in _record(kube, "cap")] == ["a", "b"]


def test_a_replica_alone_writes_each_moment_on_the_version_its_view_holds() -> None:
    """One replica, creates one after another: no read of the budget at all; every moment writes under the version
    its own last write put in its view, one round trip per create."""
    kube = MemKube()
    cap = _budgets(kube, budget("cap", limits={"a10": 2}))
    assert _admitted([_Replica(kube, cap)], ["a", "b", "c"]) == ["a", "b"]
    assert [m for m, kind, _ in kube.calls if kind == "GPUBudget"] == ["replace_status", "replace_status"]


def test_an_order_the_view_has_seen_is_counted_once() -> None:
    """Once a device is in a replica's view it counts there (§7.2), not again from the budget's record."""
    kube = MemKube()
    cap = _budgets(kube, budget("cap", limits={"a10": 2}))
    assert asyncio.run(_Replica(kube, cap).create("a")) == "admitted"
    b = _Replica(kube, cap)
    b.sees(device("a", phase="Pending"))
    assert asyncio.run(b.create("b")) == "admitted"
    assert asyncio.run(b.create("c")).startswith("denied")


def test_a_budget_over_two_namespaces_holds_when_each_replica_admits_in_another() -> None:
    """A selector budget covers t1 and t2 (§1.4); replicas admitting in different namespaces are charged to the
    one budget, so the third unit against a limit of 2 is refused."""
    kube = MemKube()
    org = _budgets(kube, budget("org", limits={"a10": 2}, namespaceSelector={"matchLabels": {"org": "x"}}))
    labels = {"t1": {"org": "x"}, "t2": {"org": "x"}}
    a, b = _Replica(kube, org, namespaces=labels), _Replica(kube, org, namespaces=labels)

    async def run() -> list[str]:
        return [
            await a.create("a"),
            await b.create("b", namespace="t2"),
            await a.create("c"),
            await b.create("d", namespace="t2"),
        ]

    assert [o[:8] for o in asyncio.run(run())] == ["admitted", "admitted", "denied: ", "denied: "]


def test_a_name_made_again_with_more_units_is_counted_at_its_new_size() -> None:
    """§14: a tenant deletes held x (1 unit) and makes x again with 3 on one replica; another replica whose view
    still has the old x must not take the new order for the old device (it admitted 1 + 2 more against 5 so)."""
    kube = MemKube()
    cap = _budgets(kube, budget("cap", limits={"a10": 5}))
    b, c = _Replica(kube, cap), _Replica(kube, cap)
    c.sees(device("x", count=1, uid="old"))  # its watch has not delivered the delete yet
    assert asyncio.run(b.create("x", count=3, uid="new")) == "admitted"
    assert asyncio.run(c.create("y", uid="y")) == "admitted"  # 3 + 1, and the old x's 1 until its delete: 5
    assert asyncio.run(c.create("z", count=2, uid="z")).startswith("denied")


def test_the_removal_of_a_names_old_device_does_not_end_the_new_ones_order() -> None:
    """§14: a replica that saw the old x go still counts the order for the new x, which its view has not seen."""
    kube = MemKube()
    cap = _budgets(kube, budget("cap", limits={"a10": 4}))
    b, c = _Replica(kube, cap), _Replica(kube, cap)
    assert asyncio.run(b.create("x", count=3, uid="new")) == "admitted"
    old = device("x", count=1, uid="old")
    old["metadata"]["resourceVersion"] = "1000000"
    c.sees(old)
    c.view.forget(kinds.GPU_DEVICE, "t1", "x", "1000001")
    assert asyncio.run(c.create("y", count=2, uid="y")).startswith("denied")  # 3 + 2 against 4


def test_an_order_whose_device_this_view_saw_go_counts_no_more() -> None:
    """A create charged, its device counted, then deleted: a replica that saw the deletion counts the order no more,
    rather than until it expires (which refused the next VMI after a leader's kill in the replicas test)."""
    kube = MemKube()
    cap = _budgets(kube, budget("cap", limits={"a10": 2}))
    b = _Replica(kube, cap)
    assert _admitted([b], ["h1", "h2"]) == ["h1", "h2"]
    c = _Replica(kube, cap)
    for name in ("h1", "h2"):
        body = device(name)
        body["metadata"]["resourceVersion"] = "1000000"
        c.sees(body)
        c.view.forget(kinds.GPU_DEVICE, "t1", name, "1000001")
    assert _admitted([c], ["h3", "h4", "h5"]) == ["h3", "h4"]


def test_creates_of_one_name_racing_on_two_replicas_count_as_two_orders() -> None:
    """§14: x of 8 units admitted on one replica, x of 1 on another whose view has not seen it (the API server
    refuses one of them later): neither replica, nor a third, may count x at 1."""
    kube = MemKube()
    cap = _budgets(kube, budget("cap", limits={"a10": 9}))
    b, c, d = _Replica(kube, cap, units=16), _Replica(kube, cap, units=16), _Replica(kube, cap, units=16)
    assert asyncio.run(b.create("x", count=8, uid="big")) == "admitted"
    assert asyncio.run(c.create("x", count=1, uid="small")) == "admitted"
    assert asyncio.run(c.create("y", count=7, uid="y")).startswith("denied")
    assert asyncio.run(d.create("z", count=7, uid="z")).startswith("denied")
    assert sorted(e.uid for e in _record(kube, "cap")) == ["big", "small"]


# -- failing closed ---------------------------------------------------------------------------------------------


def test_a_budget_that_never_gets_a_turn_fails_closed_and_keeps_no_reservation() -> None:
    """Every write conflicting (another replica always first): the create errs (the API server fails it closed),
    and its reservation goes with it, so a retry once the budget is free is admitted."""
    kube = MemKube()
    cap = _budgets(kube, budget("cap", limits={"a10": 1}))
    a = _Replica(kube, cap)
    for _ in range(25):
        kube.fail_next(Conflict(409, "Conflict", "someone wrote first"), method="replace_status")
    assert asyncio.run(a.create("x")) == "error"
    assert a.reservations.orders() == []
    assert asyncio.run(a.create("y")) == "admitted"


def test_a_busy_budget_raises_busy() -> None:
    """The charge itself says why it failed: every attempt lost to another writer."""
    kube = MemKube()
    a = _Replica(kube, _budgets(kube, budget("cap", limits={"a10": 1})))
    for _ in range(25):
        kube.fail_next(Conflict(409, "Conflict", "someone wrote first"), method="replace_status")
    order = {("t1", "x", "ux"): Order("t1", "a10", 1, "GPUDevice x")}
    with pytest.raises(Busy):
        asyncio.run(a.charges.charge("t1", order, lambda others: None))


def test_a_failed_write_fails_only_the_orders_of_that_budget() -> None:
    """§14: a status write fails (a 500): the creates charged in it err and keep no reservation; another tenant's
    create under another budget is written on its own and admitted."""
    kube = MemKube()
    budgets = _budgets(kube, budget("big", limits={"a10": 64}), budget("cap", namespace="t2", limits={"a10": 1}))
    replica = _Replica(kube, budgets, units=64)
    kube.fail_next(ApiError(500, "InternalError", "etcd is unhappy"), method="replace_status")

    async def run() -> list[str]:
        first = await asyncio.gather(replica.create("a"), replica.create("b", namespace="t2"))
        return [*first, await replica.create("c")]

    assert asyncio.run(run()) == ["error", "admitted", "admitted"]
    assert [e.name for e in _record(kube, "big")] == ["c"]


# -- tenants who share no budget share no write ------------------------------------------------------------------


class _Distant:
    """The API a round trip away: every call yields to the loop first, so concurrent admissions interleave."""

    def __init__(self, kube: MemKube) -> None:
        self._kube = kube

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._kube, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(0)
            return await method(*args, **kwargs)

        return call


def test_a_tenants_burst_writes_only_its_own_budget_and_shares_its_writes() -> None:
    """§13.5: 40 held creates of one tenant at once, one of another under another budget, one in a namespace no
    budget covers: the burst's orders share a few writes of its own budget; the other's create writes only its
    own budget, once; the namespace no budget covers writes nothing."""
    kube = MemKube()
    budgets = _budgets(kube, budget("big", limits={"a10": 64}), budget("cap", namespace="t2", limits={"a10": 1}))
    replica = _Replica(cast(AsyncKube, _Distant(kube)), budgets, units=64)

    async def run() -> list[str]:
        burst = [replica.create(f"d{i}") for i in range(40)]
        return await asyncio.gather(*burst[:20], replica.create("other", namespace="t2"), *burst[20:])

    assert asyncio.run(run()) == ["admitted"] * 41
    assert len(_record(kube, "big")) == 40 and _writes(kube, "big") <= 4, _writes(kube, "big")
    assert [e.name for e in _record(kube, "cap", "t2")] == ["other"] and _writes(kube, "cap") == 1
    before = len(kube.calls)
    assert asyncio.run(replica.create("free", namespace="t3")) == "admitted"
    assert kube.calls[before:] == []


def test_a_budget_that_does_not_limit_the_class_records_nothing() -> None:
    """Only a budget that can refuse an order records it: one limiting another class, with no total, is not
    written, so its record holds no more units than its limits."""
    kube = MemKube()
    other = _budgets(kube, budget("t4only", limits={"t4": 1}))
    assert asyncio.run(_Replica(kube, other).create("a")) == "admitted"
    assert _writes(kube) == 0


def test_a_tenants_creates_that_never_make_a_device_cannot_outgrow_its_budget_nor_refuse_another() -> None:
    """§7.4, §14: creates refused after the webhooks (their devices never come) on two replicas: the budget records
    at most its limit in units, its own later creates are refused until they expire, and another tenant's create
    under another budget is admitted meanwhile (the shared ledger refused it once full)."""
    kube = MemKube()
    budgets = _budgets(kube, budget("mine", limits={"a10": 5}), budget("victim", namespace="v", limits={"a10": 1}))
    a, b = _Replica(kube, budgets, units=64), _Replica(kube, budgets, units=64)

    async def run() -> tuple[list[str], str]:
        flood = [await (a if i % 2 else b).create(f"f{i}") for i in range(40)]
        return flood, await b.create("v1", namespace="v")

    flood, victim = asyncio.run(run())
    assert flood.count("admitted") == 5 and victim == "admitted"
    assert sum(e.count for e in _record(kube, "mine")) == 5


def test_a_budget_of_large_limits_records_at_most_so_many_orders_and_another_budget_is_not_held_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """§14: with limits far above what is used, creates that never come would grow the budget's record (and every
    write and reading of it) without bound; past RECORD_MOST orders not yet counted its own tenants' creates are
    refused, naming the budget, and another budget's create is admitted."""
    monkeypatch.setattr(charges, "RECORD_MOST", 8)
    kube = MemKube()
    budgets = _budgets(
        kube, budget("huge", limits={"a10": 1_000_000}), budget("other", namespace="v", limits={"a10": 1})
    )
    r = _Replica(kube, budgets, units=64)

    async def run() -> tuple[list[str], str]:
        flood = [await r.create(f"f{i}") for i in range(12)]
        return flood, await r.create("v1", namespace="v")

    flood, elsewhere = asyncio.run(run())
    assert flood[:8] == ["admitted"] * 8 and elsewhere == "admitted"
    assert all(o.startswith("denied: GPUBudget t1/huge has 8 orders not yet counted") for o in flood[8:]), flood[8]
    assert len(_record(kube, "huge")) == 8


def test_an_order_refused_by_its_second_budget_leaves_its_first() -> None:
    """Overlapping budgets (an org budget over t1 and t2, t2's own): an order charged to the first and refused by
    the second is withdrawn from the first, so it does not refuse the org's next order until it expires."""
    kube = MemKube()
    budgets = _budgets(
        kube,
        budget("org", limits={"a10": 2}, namespaceSelector={"matchLabels": {"org": "x"}}),
        budget("own", namespace="t2", limits={"a10": 0}),
    )
    r = _Replica(kube, budgets, namespaces={"t1": {"org": "x"}, "t2": {"org": "x"}})

    async def run() -> list[str]:
        refused = await r.create("a", namespace="t2")
        await asyncio.sleep(0.01)  # the withdrawal's moment
        return [refused, await r.create("b"), await r.create("c")]

    outcomes = asyncio.run(run())
    assert outcomes[0].startswith("denied: GPUDevice a: GPUBudget t2/own"), outcomes[0]
    assert outcomes[1:] == ["admitted", "admitted"]
    assert [e.name for e in _record(kube, "org")] == ["b", "c"]


# -- how an order leaves the record ------------------------------------------------------------------------------


def test_a_charge_leaves_counted_orders_to_the_count_and_expired_ones_go() -> None:
    """A replica charging a budget never takes off an order its view counts (only the accountant does, with `used`
    in the same write); an order whose device never came leaves at the first write after it expired."""
    kube = MemKube()
    at = [dt.datetime(2026, 12, 7, tzinfo=dt.UTC)]
    r = _Replica(kube, _budgets(kube, budget("cap", limits={"a10": 8})), clock=lambda: at[0])

    def names() -> list[str]:
        return [e.name for e in _record(kube, "cap")]

    assert asyncio.run(r.create("a")) == "admitted" and names() == ["a"]
    r.sees(device("a"))
    assert asyncio.run(r.create("b")) == "admitted" and names() == ["a", "b"]
    at[0] += dt.timedelta(seconds=31)  # b never came
    r.sees(device("c-old", uid="c-old"))
    assert asyncio.run(r.create("c")) == "admitted" and names() == ["c"]


def test_a_replica_whose_watch_is_behind_the_count_counts_what_the_accountant_took_off() -> None:
    """§7.4 across replicas: the leader's accountant took a and b off the record once `used` had them; a replica
    whose watch has not delivered a and b yet counts `used` (2 of 2) and refuses, rather than admitting a third."""
    kube = MemKube()
    [cap] = _budgets(kube, budget("cap", limits={"a10": 2}))
    cap = kube.change(
        kinds.GPU_BUDGET, {**cap, "status": {"used": {"a10": 2}, "usedTotal": 2, "countedThrough": "900"}}, status=True
    )
    behind = _Replica(kube, [cap])
    behind.view.progressed(kinds.GPU_DEVICE, "899")
    assert asyncio.run(behind.create("c")).startswith("denied: GPUDevice c: GPUBudget t1/cap allows 2 units")
    caught_up = _Replica(kube, [cap])
    caught_up.view.progressed(kinds.GPU_DEVICE, "900")  # it has every device through the count: none are left
    assert asyncio.run(caught_up.create("c")) == "admitted"


def test_a_moment_of_many_orders_lets_the_event_loop_serve_others() -> None:
    """§14.3: a burst's moment decides its orders in turns, yielding to the loop, so other tenants' admissions,
    the binder and the watches run meanwhile."""
    kube = MemKube()
    r = _Replica(kube, _budgets(kube, budget("cap", limits={"a10": 64})), units=64)
    log: list[str] = []

    def decide(others: list[Order]) -> None:
        log.append("decide")

    async def run() -> None:
        ticking = True

        async def ticker() -> None:
            while ticking:
                log.append("tick")
                await asyncio.sleep(0)

        tick = asyncio.create_task(ticker())
        await asyncio.gather(
            *[
                r.charges.charge("t1", {("t1", f"d{i}", f"u{i}"): Order("t1", "a10", 1, f"d{i}")}, decide)
                for i in range(64)
            ]
        )
        ticking = False
        await tick

    asyncio.run(run())
    first, last = log.index("decide"), len(log) - 1 - log[::-1].index("decide")
    assert log.count("decide") == 64 and "tick" in log[first:last], "the loop was blocked while the moment decided"


# -- the retired ledger (issue 36 item 3) ------------------------------------------------------------------------


def test_orders_an_older_version_left_in_its_ledger_count_until_they_expire() -> None:
    """A rolling upgrade: the retired ledger holds an order of 2 units an older replica admitted; a new replica
    takes it over and counts it, so only 1 more fits against 3, and the ledger is left as it was."""
    kube = MemKube()
    entry = {"namespace": "t1", "name": "old", "class": "a10", "count": 2, "expires": 4102444800.0, "uid": "o"}
    kube.put(CONFIG_MAP, {"metadata": {"name": LEDGER, "namespace": OPS}, "data": {"t1.old": json.dumps(entry)}})
    r = _Replica(kube, _budgets(kube, budget("cap", limits={"a10": 3})))

    async def run() -> list[str]:
        r.charges.legacy = await take_over_ledger(kube, OPS)
        return [await r.create("a"), await r.create("b")]

    assert [o[:8] for o in asyncio.run(run())] == ["admitted", "denied: "]
    assert (kube.stored(CONFIG_MAP, LEDGER, OPS) or {}).get("data") == {"t1.old": json.dumps(entry)}


def test_where_no_ledger_was_an_immutable_one_stops_an_older_replica_recording_orders() -> None:
    """A new replica finds no ledger: it leaves an empty, immutable one, so an older replica's create of the ledger
    fails (it exists), as would its write of it (the API server refuses those: tests/integration/test_charges.py)."""
    kube = MemKube()
    assert asyncio.run(take_over_ledger(kube, OPS)) == []
    stored = kube.stored(CONFIG_MAP, LEDGER, OPS)
    assert stored is not None and stored.get("immutable") is True and not stored.get("data")
