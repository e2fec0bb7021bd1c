"""§7.4 across replicas (issue 36): held creates admitted by different replicas never together exceed a budget;
each order is charged to the budgets that can refuse it, under each one's resourceVersion, as ResourceQuota charges
its quotas, so tenants who share no budget share no write and a budget's own limits bound its record."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import random
from typing import Any, cast

import pytest

from cozygpu.api import GPUBudget, kinds
from cozygpu.api.gpubudget import BudgetOrder, GPUBudgetStatus
from cozygpu.decisions.orders import Order
from cozygpu.kube.adapter import ApiError, AsyncKube, Conflict
from cozygpu.runtime import charges
from cozygpu.runtime.admission.outcomes import Refusal
from cozygpu.runtime.admission.reservations import Reservations
from cozygpu.runtime.admission.validation import Validation
from cozygpu.runtime.charges import Busy, Charges
from cozygpu.runtime.process.ledger import CONFIG_MAP, LEDGER, take_over_ledger
from cozygpu.runtime.view import View
from cozygpu.runtime.writes import Writer
from cozygpu.state.cluster import Cluster
from tests.support.memkube import MemKube
from tests.support.views import A10, L40S, budget, cluster, created, device, gpu_class, node

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

    runs = 0  # each replica's run is its own holder of set-asides

    def __init__(
        self,
        kube: AsyncKube,
        budgets: list[Body],
        *,
        charges: bool = True,
        units: int = 8,
        namespaces: dict[str, dict[str, str]] | None = None,
        clock: Any = None,
        set_aside: int = 0,
        window: float = 5.0,
    ) -> None:
        """`set_aside`: the most units of a class it sets aside on a budget (0: a write per moment, as before)."""
        self.cluster: Cluster = cluster(
            nodes=[node("n1", {A10: units}), node("n2", {L40S: units})],
            classes=[gpu_class("a10"), gpu_class("l40s", L40S)],
            budgets=budgets,
            namespaces=namespaces or {},
        )
        self.view = View(self.cluster)
        self.reservations = Reservations(ttl=30)
        kw: dict[str, Any] = {"clock": clock} if clock is not None else {}
        if set_aside:
            _Replica.runs += 1
            kw |= {"holder": f"r{_Replica.runs}", "set_aside": set_aside, "window": dt.timedelta(seconds=window)}
        self.charges = Charges(
            self.cluster,
            Writer(self.view, kube),
            30,
            mine=self.reservations.holds_device,
            reserved=self.reservations.prior,
            **kw,
        )
        self.validation = Validation(self.cluster, self.reservations, charges=self.charges if charges else None)

    async def create(
        self, name: str, *, namespace: str = "t1", count: int = 1, uid: str | None = None, class_name: str = "a10"
    ) -> str:
        body = created(name, class_name, namespace=namespace, count=count, uid=uid)
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


# -- set-asides: a replica admits within units it set aside on the budget (§7.4, §13.5) ---------------------------


def _status(kube: MemKube, name: str, namespace: str = "t1") -> GPUBudgetStatus:
    stored = kube.stored(kinds.GPU_BUDGET, name, namespace)
    assert stored is not None
    return GPUBudget.model_validate(stored).status


def _charged(status: GPUBudgetStatus) -> int:
    """Units the budget's record holds against its limits: orders and set-asides (no device is counted here)."""
    return sum(e.count for e in status.orders) + sum(a.units for a in status.set_aside)


def test_a_replica_admits_within_what_it_set_aside_without_a_write_each() -> None:
    """One replica, creates one after another under a budget with room: the first writes the budget and sets aside
    a share of what is left, the next ones are admitted within it, and only a write ahead of need renews it; every
    admitted order ends on the record as an order, so the count can take it off."""
    kube = MemKube()
    r = _Replica(kube, _budgets(kube, budget("room", limits={"a10": 100})), units=64, set_aside=8)

    async def run() -> list[str]:
        out = [await r.create(f"d{i}") for i in range(8)]
        await asyncio.sleep(0.05)  # the write ahead of need lands
        return out

    assert asyncio.run(run()) == ["admitted"] * 8
    status = _status(kube, "room")
    assert _writes(kube, "room") <= 3, _writes(kube, "room")
    assert [(a.holder, a.class_name) for a in status.set_aside] == [(r.charges.holder, "a10")]
    assert {e.name for e in status.orders} >= {f"d{i}" for i in range(5)}
    assert _charged(status) <= 100


def test_without_set_asides_every_create_writes_its_budget() -> None:
    """The control of the test above: with none set aside, the same creates take a write each."""
    kube = MemKube()
    r = _Replica(kube, _budgets(kube, budget("room", limits={"a10": 100})), units=64)

    async def run() -> list[str]:
        return [await r.create(f"d{i}") for i in range(8)]

    assert asyncio.run(run()) == ["admitted"] * 8
    assert _writes(kube, "room") == 8


def test_units_one_replica_set_aside_count_against_another() -> None:
    """r1 orders 1 of 12 and sets aside 2 more (a quarter of what is left); r2's order of 10 fits what r2 sees of
    orders (1 + 10) but not with r1's set-aside counted, so it is refused."""
    kube = MemKube()
    budgets = _budgets(kube, budget("cap", limits={"a10": 12}))
    r1, r2 = _Replica(kube, budgets, units=64, set_aside=8), _Replica(kube, budgets, units=64, set_aside=8)

    async def run() -> tuple[str, str]:
        return await r1.create("a"), await r2.create("b", count=10)

    first, second = asyncio.run(run())
    assert first == "admitted"
    assert [a.units for a in _status(kube, "cap").set_aside] == [2]
    assert second.startswith("denied: ") and "GPUBudget t1/cap" in second, second


def test_units_left_unused_leave_the_budget_after_the_window() -> None:
    """r1's set-aside, unused past its window, is let go by r1's own write, so r2's order that it blocked fits."""
    kube = MemKube()
    budgets = _budgets(kube, budget("cap", limits={"a10": 12}))
    r1 = _Replica(kube, budgets, units=64, set_aside=8, window=0.05)
    r2 = _Replica(kube, budgets, units=64, set_aside=8)

    async def run() -> tuple[str, str, list[int], str]:
        first = await r1.create("a")
        blocked = await r2.create("b", count=10)
        await asyncio.sleep(0.3)  # the window passes, and r1 writes its set-aside off
        left = [a.units for a in _status(kube, "cap").set_aside]
        r2.view.apply(kinds.GPU_BUDGET, kube.stored(kinds.GPU_BUDGET, "cap", "t1") or {})  # r2's watch has it
        return first, blocked, left, await r2.create("c", count=10)

    first, blocked, left, after = asyncio.run(run())
    assert (first, blocked[:8], left, after) == ("admitted", "denied: ", [], "admitted")


def test_a_replica_never_admits_within_units_of_an_earlier_run() -> None:
    """A replica restarted is another holder: what its earlier run set aside counts against it like anyone's, so
    the orders that run admitted within them (unknown to the new one) stay covered until the units expire."""
    kube = MemKube()
    budgets = _budgets(kube, budget("cap", limits={"a10": 12}))
    before = _Replica(kube, budgets, units=64, set_aside=8)
    assert asyncio.run(before.create("a")) == "admitted"
    after = _Replica(kube, budgets, units=64, set_aside=8)
    assert asyncio.run(after.create("b", count=10)).startswith("denied: ")


def test_a_lowered_limit_stops_admissions_within_a_set_aside() -> None:
    """§7.3: r1 set units aside under a limit of 40, r2 has 9 ordered; the limit drops to 10. r1's own view still
    lets 1 more in (its 1 + 1), but not within what it set aside under the old limit: its moment counts r2's 9."""
    kube = MemKube()
    budgets = _budgets(kube, budget("cap", limits={"a10": 40}))
    r1, r2 = _Replica(kube, budgets, units=64, set_aside=8), _Replica(kube, budgets, units=64, set_aside=8)
    assert asyncio.run(r1.create("a")) == "admitted"
    assert asyncio.run(r2.create("b", count=9)) == "admitted"
    stored = kube.stored(kinds.GPU_BUDGET, "cap", "t1")
    assert stored is not None and _status(kube, "cap").set_aside
    lowered = kube.change(kinds.GPU_BUDGET, {**stored, "spec": {"limits": {"a10": 10}}})
    r1.view.apply(kinds.GPU_BUDGET, lowered)
    assert asyncio.run(r1.create("c")).startswith("denied: ")


def test_set_asides_of_several_classes_stay_within_a_total_together() -> None:
    """A total of 40: r2 orders 10; r1 orders l40s, then a10 one at a time, then l40s again, setting aside units of
    both classes. Each class's share counts r1's units of the other, so together r1's and r2's stay within 40
    (before: r1 admitted 34, 44 of 40)."""
    kube = MemKube()
    budgets = _budgets(kube, budget("cap", total=40))
    r1, r2 = _Replica(kube, budgets, units=64, set_aside=32), _Replica(kube, budgets, units=64)

    async def run() -> int:
        assert await r2.create("big", count=10) == "admitted"
        names = [("l0", "l40s")] + [(f"a{i}", "a10") for i in range(60)] + [(f"l{i}", "l40s") for i in range(1, 20)]
        units = 0
        for name, class_name in names:
            units += await r1.create(name, class_name=class_name) == "admitted"
            await asyncio.sleep(0.001)  # each write ahead of need lands
        return units

    assert asyncio.run(run()) + 10 <= 40


def test_a_budget_made_again_under_its_name_is_not_admitted_within_the_old_ones_set_aside() -> None:
    """r1 sets units aside on cap; cap is deleted and made again with the same spec (a re-apply), recording no
    set-aside, so r2 orders all of it; r1's next order is refused, not admitted within the old object's units."""
    kube = MemKube()
    [old] = _budgets(kube, budget("cap", limits={"a10": 40}))
    r1 = _Replica(kube, [old], units=64, set_aside=8)

    async def run() -> list[str]:
        got = [await r1.create("a")]
        gone = kube.remove(kinds.GPU_BUDGET, "cap", "t1")
        r1.view.forget(kinds.GPU_BUDGET, "t1", "cap", gone["metadata"]["resourceVersion"])
        [new] = _budgets(kube, budget("cap", limits={"a10": 40}))
        r1.view.apply(kinds.GPU_BUDGET, new)
        r2 = _Replica(kube, [new], units=64)
        r2.sees(device("a"))  # a's device counts against the new object too
        got.append(await r2.create("b", count=39))
        return [*got, await r1.create("c")]

    got = asyncio.run(run())
    assert got[:2] == ["admitted"] * 2, got
    assert got[2].startswith("denied: "), got


def test_units_that_gave_way_are_admitted_within_no_more() -> None:
    """r1's 2 unused a10 units give way to its 10 l40s (11 of 12 in total); r2 then orders the last unit, so r1's
    next a10 unit is refused, not admitted within the units that went."""
    kube = MemKube()
    budgets = _budgets(kube, budget("cap", total=12))
    r1, r2 = _Replica(kube, budgets, units=64, set_aside=8), _Replica(kube, budgets, units=64)

    async def run() -> list[str]:
        return [
            await r1.create("a"),
            await r1.create("t", count=10, class_name="l40s"),
            await r2.create("z"),
            await r1.create("b"),
        ]

    got = asyncio.run(run())
    assert got[:3] == ["admitted"] * 3, got
    assert "GPUBudget t1/cap allows 12 units in total" in got[3], got


def test_units_set_aside_for_one_class_give_way_to_an_order_of_another_that_needs_them() -> None:
    """A budget of 12 in total: r1 orders 1 a10 and sets 2 more aside. Its order of 10 l40s fits the orders (11) but
    not with the 2: the 2 go, not the order (one replica never refuses for units it holds unused), and nothing is
    admitted within them after: of two more a10 units, one fits the 12 and the other is refused."""
    kube = MemKube()
    r = _Replica(kube, _budgets(kube, budget("cap", total=12)), units=64, set_aside=8)

    async def run() -> list[str]:
        return [
            await r.create("a"),
            await r.create("t", count=10, class_name="l40s"),
            await r.create("b"),
            await r.create("c"),
        ]

    got = asyncio.run(run())
    assert got[:3] == ["admitted"] * 3, got
    assert "GPUBudget t1/cap allows 12 units in total" in got[3], got


def test_past_its_window_a_set_aside_admits_nothing_more() -> None:
    """Once fewer than `ttl` seconds of a set-aside are left, an order admitted within it could outlive its
    charge: the next create writes the budget instead."""
    now = [dt.datetime(2026, 1, 1, tzinfo=dt.UTC)]
    kube = MemKube()
    r = _Replica(kube, _budgets(kube, budget("room", limits={"a10": 100})), units=64, set_aside=8, clock=lambda: now[0])

    async def run() -> tuple[int, int]:
        await r.create("a")
        await r.create("b")
        within = _writes(kube, "room")
        now[0] += dt.timedelta(seconds=6)  # past the 5 s window, still within the units' life
        await r.create("c")
        return within, _writes(kube, "room")

    assert asyncio.run(run()) == (1, 2)


def test_an_order_refused_by_its_second_budget_gives_back_what_it_took_within_the_first() -> None:
    """Overlapping budgets: the org's has units set aside here, t1's own refuses the order: the units it took
    within the org's set-aside are free again at once, with no write."""
    kube = MemKube()
    labels = {"t1": {"org": "o"}}
    budgets = _budgets(
        kube,
        budget("org", namespace="ops", limits={"a10": 100}, namespaceSelector={"matchLabels": {"org": "o"}}),
        budget("t1cap", limits={"a10": 2}),
    )
    r = _Replica(kube, budgets, units=64, set_aside=8, namespaces=labels)

    async def run() -> list[str]:
        return [await r.create("a"), await r.create("b", count=2)]

    assert [o[:8] for o in asyncio.run(run())] == ["admitted", "denied: "]
    aside = r.charges._aside[("ops", "org")]["a10"]  # what the refusal gave back, in memory only
    assert aside.taken == 0


class _Gated:
    """The API, whose status writes wait for a pass while it is `shut`."""

    def __init__(self, kube: MemKube) -> None:
        self._kube, self.passes, self.shut = kube, asyncio.Semaphore(0), False

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._kube, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            if name == "replace_status" and self.shut:
                await self.passes.acquire()
            return await method(*args, **kwargs)

        return call


def test_what_is_admitted_while_a_set_aside_is_written_again_stays_covered() -> None:
    """r1's write ahead of need is in flight when r1 admits 3 more within its old set-aside; the budget has room
    for only 2 more by then, but the set-aside written keeps the 3 it held, so r2's order of 8 that fits the record
    otherwise is refused (40 would be 41)."""
    kube = MemKube()
    budgets = _budgets(kube, budget("cap", limits={"a10": 40}))
    gated = _Gated(kube)
    r1, r2 = _Replica(cast(AsyncKube, gated), budgets, units=64, set_aside=8), _Replica(kube, budgets, units=64)

    async def run() -> tuple[list[str], str]:
        out = [await r1.create("a"), await r2.create("b", count=24)]
        r1.view.apply(kinds.GPU_BUDGET, kube.stored(kinds.GPU_BUDGET, "cap", "t1") or {})
        gated.shut = True
        out += [await r1.create(f"c{i}") for i in range(1, 6)]  # the fifth leaves 3 of 8: written again
        await asyncio.sleep(0.01)
        out += [await r1.create(f"c{i}") for i in range(6, 9)]  # within the old set-aside, its write in flight
        gated.passes.release()  # that write lands; the next one (of the 3) waits
        await asyncio.sleep(0.01)
        r2.view.apply(kinds.GPU_BUDGET, kube.stored(kinds.GPU_BUDGET, "cap", "t1") or {})
        last = await r2.create("d", count=8)
        gated.passes.release()
        return out, last

    admitted, last = asyncio.run(run())
    assert admitted == ["admitted"] * 10
    assert last.startswith("denied: "), last


def test_an_order_that_waited_for_a_moment_is_admitted_within_what_the_last_one_set_aside() -> None:
    """Eight orders use up what the first set aside while its write ahead of need is in flight; the ninth waits for
    that write, which sets units aside again, and is admitted within them, never decided on the budget's record."""
    kube = MemKube()
    budgets = _budgets(kube, budget("room", limits={"a10": 100}))
    gated = _Gated(kube)
    r = _Replica(cast(AsyncKube, gated), budgets, units=64, set_aside=8)
    decided: list[str] = []

    def decide(_: list[Order]) -> str | None:
        decided.append("decide")
        return None

    def claims(name: str) -> dict[tuple[str, str, str], Order]:
        return {("t1", name, ""): Order("t1", "a10", 1, name)}

    async def run() -> list[str | None]:
        out = [await r.charges.charge("t1", claims("a"), decide)]  # decided and written: sets 8 aside
        gated.shut = True
        out += [await r.charges.charge("t1", claims(f"c{i}"), decide) for i in range(1, 9)]  # the write after 5 waits
        ninth = asyncio.ensure_future(r.charges.charge("t1", claims("c9"), decide))
        await asyncio.sleep(0.01)
        gated.passes.release()  # the write ahead of need lands; then the ninth's moment
        gated.passes.release()
        out.append(await ninth)
        return out

    assert asyncio.run(run()) == [None] * 10
    assert decided == ["decide"]
    assert {e.name for e in _record(kube, "room")} >= {"a", "c9"}


def test_an_order_admitted_within_in_a_moment_whose_write_fails_is_not_written_later() -> None:
    """The ninth order of the test above is admitted within at its moment, but the moment's write fails (a 500):
    the create errs, and the next write records the orders admitted before it, not the ninth."""
    kube = MemKube()
    budgets = _budgets(kube, budget("room", limits={"a10": 100}))
    gated = _Gated(kube)
    r = _Replica(cast(AsyncKube, gated), budgets, units=64, set_aside=8)

    async def run() -> list[str]:
        out = [await r.create("a")]
        gated.shut = True
        out += [await r.create(f"c{i}") for i in range(1, 9)]
        ninth = asyncio.ensure_future(r.create("c9"))
        await asyncio.sleep(0.01)
        gated.passes.release()  # the write ahead of need lands
        await asyncio.sleep(0.01)
        kube.fail_next(ApiError(500, "InternalError", "etcd is unhappy"), method="replace_status")
        gated.shut = False
        gated.passes.release()
        out.append(await ninth)
        return [*out, await r.create("z")]

    assert asyncio.run(run()) == ["admitted"] * 9 + ["error", "admitted"]
    names = {e.name for e in _record(kube, "room")}
    assert "c9" not in names and {"a", "c8", "z"} <= names, names


def test_a_set_aside_in_use_is_written_again_before_its_window_ends() -> None:
    """An order admitted within units past half their window starts a write ahead of need, so an order after the
    window's end is still admitted within units (renewed), with no write of its own."""
    now = [dt.datetime(2026, 1, 1, tzinfo=dt.UTC)]
    kube = MemKube()
    r = _Replica(kube, _budgets(kube, budget("room", limits={"a10": 100})), units=64, set_aside=8, clock=lambda: now[0])

    async def run() -> list[int]:
        await r.create("a")
        now[0] += dt.timedelta(seconds=3)  # past half the 5 s window
        await r.create("b")
        await asyncio.sleep(0.01)
        renewed = _writes(kube, "room")
        now[0] += dt.timedelta(seconds=3)  # past the first window's end, within the renewed one
        await r.create("c")
        return [renewed, _writes(kube, "room")]

    assert asyncio.run(run()) == [2, 2]


def test_orders_admitted_within_a_set_aside_count_toward_the_most_a_budget_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """§14: creates that never come, admitted within units set aside, would be written as orders past RECORD_MOST
    (here 4): the fifth is decided on the record instead, and refused naming the budget."""
    monkeypatch.setattr(charges, "RECORD_MOST", 4)
    kube = MemKube()
    r = _Replica(kube, _budgets(kube, budget("room", limits={"a10": 100})), units=64, set_aside=8)

    async def run() -> list[str]:
        out = [await r.create(n) for n in "abcde"]
        await asyncio.sleep(0.01)
        return out

    outcomes = asyncio.run(run())
    assert outcomes[:4] == ["admitted"] * 4
    assert "GPUBudget t1/room has 4 orders not yet counted" in outcomes[4], outcomes[4]
    assert len(_record(kube, "room")) <= 4


class _OldDefinition:
    """The API under a GPUBudget definition that predates set-asides: it prunes `status.setAside` from writes."""

    def __init__(self, kube: MemKube) -> None:
        self._kube = kube

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._kube, name)

        async def call(kind: Any, body: Body, *args: Any, **kwargs: Any) -> Any:
            if name == "replace_status":
                body = {**body, "status": {k: v for k, v in body["status"].items() if k != "setAside"}}
            return await method(kind, body, *args, **kwargs)

        return call if name == "replace_status" else method


def test_units_the_api_server_did_not_store_are_not_admitted_within() -> None:
    """A CRD not yet updated drops `status.setAside`: other replicas would never count the units, so this one
    admits nothing within them; each create is decided and written, as with none set aside."""
    kube = MemKube()
    r = _Replica(
        cast(AsyncKube, _OldDefinition(kube)), _budgets(kube, budget("room", limits={"a10": 100})), set_aside=8
    )

    async def run() -> list[str]:
        return [await r.create(n) for n in "abc"]

    assert asyncio.run(run()) == ["admitted"] * 3
    assert _writes(kube, "room") == 3 and not _status(kube, "room").set_aside


def test_replicas_with_set_asides_never_together_exceed_a_budget() -> None:
    """§7.4: three replicas with set-asides, creates of 1-3 units spread over them at random and at once: the
    budget's record never holds more than its limit, and no more units are admitted than it allows."""
    rng = random.Random(7)
    for _ in range(60):
        limit = rng.randint(3, 40)
        sizes = [rng.randint(1, 3) for _ in range(40)]
        admitted, most = asyncio.run(_race(rng, limit, sizes))
        assert admitted <= limit and most <= limit, (limit, admitted, most)
        assert admitted > 0


async def _race(rng: random.Random, limit: int, sizes: list[int]) -> tuple[int, int]:
    """Creates of `sizes` units at once over three replicas with set-asides: units admitted, and the most units the
    budget's record held at any write."""
    kube = MemKube()
    budgets = _budgets(kube, budget("cap", limits={"a10": limit}))
    distant = cast(AsyncKube, _Distant(kube))
    replicas = [_Replica(distant, budgets, units=256, set_aside=rng.randint(1, 8)) for _ in range(3)]
    most = 0

    async def one(i: int) -> str:
        nonlocal most
        await asyncio.sleep(rng.random() / 100)
        out = await replicas[rng.randrange(3)].create(f"d{i}", count=sizes[i])
        most = max(most, _charged(_status(kube, "cap")))
        return out

    outcomes = await asyncio.gather(*(one(i) for i in range(len(sizes))))
    return sum(n for n, o in zip(sizes, outcomes, strict=True) if o == "admitted"), most


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
