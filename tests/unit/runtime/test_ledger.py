"""§7.4 across replicas (issue 21 item 3): held-device creates admitted by different replicas never together
exceed a budget; the namespace's order ledger in the API, written under the version read, is where they meet."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, cast

import pytest

from cozygpu.api import kinds
from cozygpu.decisions.budgets import Order
from cozygpu.kube.adapter import ApiError, AsyncKube, Conflict
from cozygpu.runtime.admission.outcomes import Refusal
from cozygpu.runtime.admission.reservations import Reservations
from cozygpu.runtime.admission.validation import Validation
from cozygpu.runtime.ledger import CONFIG_MAP, HELD_BYTES, HELD_MAX, NAME, Busy, Entry, Ledger, _key, _size, _value
from cozygpu.runtime.view import View
from tests.support.memkube import MemKube
from tests.support.views import A10, budget, cluster, created, device, gpu_class, node

OPS = "cozy-gpu-system"
USER = "system:serviceaccount:t1:tenant"


def _replica(kube: MemKube, *, ledger: bool = True) -> Validation:
    """A replica's device webhook: its own view (a budget of 2 A10 units in t1, nothing created yet), its own
    reservations, and the cluster's one API."""
    view = cluster(
        nodes=[node("n1", {A10: 8})],
        classes=[gpu_class("a10")],
        budgets=[budget("cap", namespace="t1", limits={"a10": 2})],
    )
    reservations = Reservations(ttl=30)
    shared = Ledger(kube, OPS, 30, view, mine=reservations.holds_device) if ledger else None
    return Validation(view, reservations, ledger=shared)


async def _create(replica: Validation, name: str, review: str) -> bool:
    try:
        await replica.device("CREATE", created(name), None, USER, False, review=review)
    except Refusal:
        return False
    return True


def _admitted(replicas: list[Validation], names: list[str], ledger: bool = True) -> list[str]:
    async def run() -> list[str]:
        out = []
        for i, name in enumerate(names):
            if await _create(replicas[i % len(replicas)], name, f"review-{name}"):
                out.append(name)
        return out

    return asyncio.run(run())


def test_creates_spread_over_two_replicas_stop_at_the_budget() -> None:
    """Neither replica's view has seen a device yet; through the ledger the third order of 1 unit against a
    limit of 2 is refused, wherever it lands (each replica alone would admit two)."""
    kube = MemKube()
    assert _admitted([_replica(kube), _replica(kube)], ["a", "b", "c", "d"]) == ["a", "b"]


def test_without_the_ledger_two_replicas_together_exceed_the_budget() -> None:
    """The gap the ledger closes: per-process reservations do not see each other (the test above fails so)."""
    kube = MemKube()
    assert _admitted([_replica(kube, ledger=False), _replica(kube, ledger=False)], ["a", "b", "c", "d"]) == [
        "a",
        "b",
        "c",
        "d",
    ]


def _another_replica_writes_b_before_the_next_write(kube: MemKube) -> None:
    """Another replica's admission of b (1 unit in t1) lands in the ledger just before this one's next write."""

    def meanwhile() -> None:
        stored = kube.stored(CONFIG_MAP, NAME, OPS)
        assert stored is not None
        entry = json.dumps({"namespace": "t1", "name": "b", "class": "a10", "count": 1, "expires": time.time() + 30})
        kube.change(CONFIG_MAP, {**stored, "data": {**stored["data"], "t1.b": entry}})

    kube.before_next("replace", meanwhile)


def test_a_replica_that_loses_the_write_checks_again_with_the_winners_order() -> None:
    """Two admissions read the same ledger; the other replica writes first; this one's write conflicts, it reads
    again, and its order no longer fits."""
    kube = MemKube()
    a = _replica(kube)
    assert asyncio.run(_create(a, "a", "r1"))

    _another_replica_writes_b_before_the_next_write(kube)
    assert not asyncio.run(_create(a, "c", "r3"))
    data: dict[str, Any] = (kube.stored(CONFIG_MAP, NAME, OPS) or {}).get("data") or {}
    assert sorted(data) == ["t1.a", "t1.b"]


def test_an_order_the_view_has_seen_is_counted_once() -> None:
    """Once a device is in a replica's view it counts there (§7.2), not again from the ledger."""
    kube = MemKube()
    a = _replica(kube)
    assert asyncio.run(_create(a, "a", "r1"))
    cap = budget("cap", namespace="t1", limits={"a10": 2})
    view = cluster(
        nodes=[node("n1", {A10: 8})], classes=[gpu_class("a10")], budgets=[cap], devices=[device("a", phase="Pending")]
    )
    reservations = Reservations(ttl=30)
    b = Validation(view, reservations, ledger=Ledger(kube, OPS, 30, view, mine=reservations.holds_device))
    assert asyncio.run(_create(b, "b", "r2"))
    assert not asyncio.run(_create(b, "c", "r3"))


def test_a_ledger_that_never_gets_a_turn_fails_closed() -> None:
    """Every write conflicting (another replica always first): the admission is not admitted, it errs (the API
    server fails closed and the tenant retries)."""
    kube = MemKube()
    ledger = Ledger(kube, OPS, 30, cluster())

    for _ in range(25):
        kube.fail_next(Conflict(409, "Conflict", "someone wrote first"), method="create")
    with pytest.raises(Busy):
        asyncio.run(ledger.admit(Order("t1", "a10", 1, "GPUDevice x"), "x", "u1", lambda others: None))


def test_a_budget_over_two_namespaces_holds_when_each_replica_admits_in_another() -> None:
    """A selector budget covers t1 and t2 (§1.4); replicas admitting in different namespaces still take turns on
    the one ledger, so the third unit against a limit of 2 is refused."""
    kube = MemKube()

    def replica() -> Validation:
        org = budget("org", namespace="t1", limits={"a10": 2}, namespaceSelector={"matchLabels": {"org": "x"}})
        view = cluster(
            nodes=[node("n1", {A10: 8})],
            classes=[gpu_class("a10")],
            budgets=[org],
            namespaces={"t1": {"org": "x"}, "t2": {"org": "x"}},
        )
        reservations = Reservations(ttl=30)
        return Validation(view, reservations, ledger=Ledger(kube, OPS, 30, view, mine=reservations.holds_device))

    a, b = replica(), replica()

    async def run() -> list[bool]:
        return [
            await _create(a, "a", "r1"),
            await _create_in(b, "t2", "b", "r2"),
            await _create(a, "c", "r3"),
            await _create_in(b, "t2", "d", "r4"),
        ]

    assert asyncio.run(run()) == [True, True, False, False]


async def _create_in(replica: Validation, namespace: str, name: str, review: str) -> bool:
    try:
        await replica.device("CREATE", created(name, namespace=namespace), None, USER, False, review=review)
    except Refusal:
        return False
    return True


def _replica_of(kube: MemKube, limit: int) -> tuple[Validation, View]:
    """A replica with a budget of `limit` A10 units in t1, and its view to feed as its watch would."""
    view = cluster(
        nodes=[node("n1", {A10: 8})],
        classes=[gpu_class("a10")],
        budgets=[budget("cap", namespace="t1", limits={"a10": limit})],
    )
    reservations = Reservations(ttl=30)
    return Validation(view, reservations, ledger=Ledger(kube, OPS, 30, view, mine=reservations.holds_device)), View(
        view
    )


async def _create_as(replica: Validation, name: str, count: int, uid: str) -> bool:
    try:
        await replica.device("CREATE", created(name, count=count, uid=uid), None, USER, False, review=f"r-{uid}")
    except Refusal:
        return False
    return True


def test_a_name_made_again_with_more_units_is_counted_at_its_new_size() -> None:
    """§14: a tenant deletes held x (1 unit) and makes x again with 3 on one replica; another replica whose view
    still has the old x must not take the new order for the old device (it admitted 1 + 2 more against 5 so)."""
    kube = MemKube()
    b, _ = _replica_of(kube, 5)
    c, c_view = _replica_of(kube, 5)
    c_view.apply(kinds.GPU_DEVICE, device("x", count=1, uid="old"))  # its watch has not delivered the delete yet
    assert asyncio.run(_create_as(b, "x", 3, "new"))
    assert asyncio.run(_create_as(c, "y", 1, "y"))  # 3 + 1, and the old x's 1 until its delete arrives: 5
    assert not asyncio.run(_create_as(c, "z", 2, "z"))


def test_the_removal_of_a_names_old_device_does_not_end_the_new_ones_order() -> None:
    """§14: a replica that saw the old x go (at a version newer than the ledger it was recorded on) still counts the
    order for the new x, which its view has not seen yet (it dropped the order as the old device's so)."""
    kube = MemKube()
    b, _ = _replica_of(kube, 4)
    assert asyncio.run(_create_as(b, "x", 3, "new"))
    c, c_view = _replica_of(kube, 4)
    old = device("x", count=1, uid="old")
    old["metadata"]["resourceVersion"] = "1000000"
    c_view.apply(kinds.GPU_DEVICE, old)
    c_view.forget(kinds.GPU_DEVICE, "t1", "x", "1000001")
    assert not asyncio.run(_create_as(c, "y", 2, "y"))  # 3 + 2 against 4


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


def test_a_tenants_burst_of_creates_does_not_queue_another_tenants_create_behind_it() -> None:
    """§14: 40 held creates of one tenant at once and one of another, on one replica: the other's is confirmed in
    the first ledger writes, with the burst's orders, not after one ledger round trip per create of the burst
    ahead of it (20 before it, under the one lock every held create took across its ledger write)."""
    kube = MemKube()
    view = cluster(
        nodes=[node("n1", {A10: 64})],
        classes=[gpu_class("a10")],
        budgets=[budget("big", namespace="t1", limits={"a10": 64}), budget("cap", namespace="t2", limits={"a10": 1})],
    )
    reservations = Reservations(ttl=30)
    replica = Validation(
        view,
        reservations,
        ledger=Ledger(cast(AsyncKube, _Distant(kube)), OPS, 30, view, mine=reservations.holds_device),
    )

    def ledger_writes() -> int:
        return sum(1 for method, kind, _ in kube.calls if kind == "ConfigMap" and method in ("create", "replace"))

    writes_before_answer: list[int] = []

    async def create(namespace: str, name: str) -> bool:
        try:
            await replica.device("CREATE", created(name, namespace=namespace), None, USER, False, review=name)
        except Refusal:
            return False
        finally:
            if namespace == "t2":
                writes_before_answer.append(ledger_writes())
        return True

    async def run() -> list[bool]:
        burst = [create("t1", f"d{i}") for i in range(40)]
        return await asyncio.gather(*burst[:20], create("t2", "other"), *burst[20:])

    assert asyncio.run(run()) == [True] * 41
    assert writes_before_answer[0] <= 2, f"the other tenant's create waited for {writes_before_answer[0]} writes"
    assert len((kube.stored(CONFIG_MAP, NAME, OPS) or {}).get("data") or {}) == 41


def _two_tenants(kube: MemKube) -> Validation:
    view = cluster(
        nodes=[node("n1", {A10: 64})],
        classes=[gpu_class("a10")],
        budgets=[budget("big", namespace="t1", limits={"a10": 64}), budget("cap", namespace="t2", limits={"a10": 1})],
    )
    reservations = Reservations(ttl=30)
    return Validation(
        view,
        reservations,
        ledger=Ledger(cast(AsyncKube, _Distant(kube)), OPS, 30, view, mine=reservations.holds_device),
    )


async def _outcome(replica: Validation, namespace: str, name: str) -> str:
    try:
        await replica.device("CREATE", created(name, namespace=namespace), None, USER, False, review=name)
    except Refusal as e:
        return f"denied: {e}"
    except Exception:
        return "error"
    return "admitted"


def test_a_failed_ledger_write_leaves_no_reservation_behind() -> None:
    """§14: a write of a moment fails (a 500): every create in it errs, and none keeps its reservation, so the
    other tenant's retry is admitted (it was refused for the reservation of its own failed create until it
    expired, once creates shared a write)."""
    kube = MemKube()
    replica = _two_tenants(kube)
    kube.fail_next(ApiError(500, "InternalError", "etcd is unhappy"), method="create")

    async def run() -> list[str]:
        first = await asyncio.gather(_outcome(replica, "t1", "a"), _outcome(replica, "t2", "b"))
        return [*first, await _outcome(replica, "t2", "c")]

    assert asyncio.run(run()) == ["error", "error", "admitted"]


def test_a_moment_of_many_orders_lets_the_event_loop_serve_others() -> None:
    """§14.3: a burst's moment decides its orders in turns, yielding to the loop, so other tenants' admissions,
    the binder and the watches run meanwhile (the loop was blocked for the whole moment)."""
    kube = MemKube()
    ledger = Ledger(kube, OPS, 30, cluster(classes=[gpu_class("a10")]))
    log: list[str] = []

    def decide(i: int) -> Any:
        def run(others: list[Order]) -> tuple[None, dict[Any, Order]]:
            log.append("decide")
            return None, {("t1", f"d{i}", f"u{i}"): Order("t1", "a10", 1, f"d{i}")}

        return run

    async def run() -> None:
        ticking = True

        async def ticker() -> None:
            while ticking:
                log.append("tick")
                await asyncio.sleep(0)

        tick = asyncio.create_task(ticker())
        await asyncio.gather(*[ledger.record(decide(i)) for i in range(64)])
        ticking = False
        await tick

    asyncio.run(run())
    first, last = log.index("decide"), len(log) - 1 - log[::-1].index("decide")
    assert log.count("decide") == 64 and "tick" in log[first:last], "the loop was blocked while the moment decided"


def test_creates_of_one_name_racing_on_two_replicas_count_as_two_orders() -> None:
    """§14: x of 8 units admitted on one replica, x of 1 on another whose view has not seen it (the API server
    refuses one of them later): neither replica, nor a third, may count x at 1 (y of 7 and z of 7 were admitted
    against 9 when the second's reservation hid the first order by name, and its write replaced its entry)."""
    kube = MemKube()
    b, _ = _replica_of(kube, 9)
    c, _ = _replica_of(kube, 9)
    d, _ = _replica_of(kube, 9)
    assert asyncio.run(_create_as(b, "x", 8, "big"))
    assert asyncio.run(_create_as(c, "x", 1, "small"))
    assert not asyncio.run(_create_as(c, "y", 7, "y"))
    assert not asyncio.run(_create_as(d, "z", 7, "z"))


def _ledger_calls(kube: MemKube, method: str) -> int:
    return sum(1 for m, kind, _ in kube.calls if kind == "ConfigMap" and m == method)


def test_a_replica_alone_decides_each_moment_on_the_ledger_it_last_wrote() -> None:
    """One replica, creates one after another: the ledger is read once, at the first; every later moment writes
    under the version its own last write returned, one API round trip, not a read and a write."""
    kube = MemKube()
    assert _admitted([_replica(kube)], ["a", "b", "c"]) == ["a", "b"]
    assert (_ledger_calls(kube, "get"), _ledger_calls(kube, "create"), _ledger_calls(kube, "replace")) == (1, 1, 1)


def test_after_a_conflict_the_next_moments_read_before_they_write() -> None:
    """Another replica writes the ledger between two of this one's moments: the write on the version this one
    last wrote conflicts, it reads and decides again (so the other's order counts), and while another replica is
    writing, its next moment reads first instead of paying a failed write again."""
    kube = MemKube()
    a = _replica(kube)
    assert asyncio.run(_create(a, "a", "r1"))

    _another_replica_writes_b_before_the_next_write(kube)
    assert not asyncio.run(_create(a, "c", "r3"))  # b, written by the other replica, fills the budget
    assert (_ledger_calls(kube, "get"), _ledger_calls(kube, "replace")) == (2, 1)  # the conflict, then a read
    calls = len(kube.calls)
    asyncio.run(_create(a, "d", "r4"))
    assert [m for m, kind, _ in kube.calls[calls:] if kind == "ConfigMap"][:1] == ["get"]


def test_a_ledger_deleted_since_this_replica_wrote_it_is_made_again() -> None:
    """Someone deletes the ledger: the next write on the version this replica last wrote finds nothing, and the
    moment reads and creates it again rather than failing every order of the moment."""
    kube = MemKube()
    a = _replica(kube)
    assert asyncio.run(_create(a, "a", "r1"))
    kube.remove(CONFIG_MAP, NAME, OPS)
    assert asyncio.run(_create(a, "b", "r2"))
    assert sorted((kube.stored(CONFIG_MAP, NAME, OPS) or {}).get("data") or {}) == ["t1.b"]


def test_one_namespace_flooding_the_ledger_is_refused_before_it_fills_and_another_is_not() -> None:
    """§14: the ledger is one ConfigMap (the API server caps its data at 1 MiB, and a write past that fails every
    tenant's orders); held orders fill it only so far: past that, the namespace holding more than its share is
    refused, its message naming it, while another namespace's order is admitted."""
    kube = MemKube()
    view = cluster(
        nodes=[node("n1", {A10: 8})],
        classes=[gpu_class("a10")],
        budgets=[
            budget("big", namespace="t1", limits={"a10": 10_000}),
            budget("cap", namespace="t2", limits={"a10": 10}),
        ],
    )
    reservations = Reservations(ttl=30)
    ledger = Ledger(kube, OPS, 30, view, mine=reservations.holds_device, held_bytes=4096)
    replica = Validation(view, reservations, ledger=ledger)

    async def run() -> tuple[list[str], str]:
        flood = [await _outcome(replica, "t1", f"flood-{i:03d}-{'x' * 100}") for i in range(40)]
        return flood, await _outcome(replica, "t2", "other")

    flood, other = asyncio.run(run())
    refused = [o for o in flood if o != "admitted"]
    assert 0 < len(refused) < 40 and flood[0] == "admitted"
    assert all(o.startswith("denied: GPUDevice flood-") and "namespace t1 has" in o for o in refused), refused[0]
    assert other == "admitted"
    data: dict[str, str] = (kube.stored(CONFIG_MAP, NAME, OPS) or {}).get("data") or {}
    assert sum(len(k) + len(v) for k, v in data.items()) <= 4096 + 512  # the share, and the other's one entry


def test_held_orders_never_take_the_ledger_past_its_most_however_many_namespaces_share_it() -> None:
    """§14: one namespace fills the held orders' room, then 250 others each order once, each under its share: they
    still stop where the room for held orders ends (HELD_MAX, as a part of `held_bytes`), so tenants spread over many
    namespaces cannot fill the ledger for the binder's orders either (by shares alone it would reach twice the room)."""
    kube = MemKube()
    view = cluster(
        nodes=[node("n1", {A10: 8})],
        classes=[gpu_class("a10")],
        budgets=[budget(f"b{i}", namespace=f"t{i}", limits={"a10": 1000}) for i in range(251)],
    )
    reservations = Reservations(ttl=30)
    ledger = Ledger(kube, OPS, 30, view, mine=reservations.holds_device, held_bytes=16384)
    replica = Validation(view, reservations, ledger=ledger)

    async def run() -> tuple[list[str], list[str]]:
        first = [await _outcome(replica, "t0", f"a{i:03d}") for i in range(200)]
        return first, [await _outcome(replica, f"t{i}", "b") for i in range(1, 251)]

    first, others = asyncio.run(run())
    assert first[0] == "admitted" and first[-1] != "admitted"
    assert others[0] == "admitted" and others[-1] != "admitted"
    data: dict[str, str] = (kube.stored(CONFIG_MAP, NAME, OPS) or {}).get("data") or {}
    assert sum(len(k) + len(v) for k, v in data.items()) <= 16384 * HELD_MAX // HELD_BYTES


def test_an_entrys_size_is_never_less_than_it_takes_in_the_config_map() -> None:
    """The room is counted without writing entries out: the estimate is never below what is written, so the ledger
    cannot pass the API server's limit by an estimate too low."""
    entries = [
        Entry("t1", "d", "a10", 1, time.time() + 30),
        Entry("n" * 63, "x" * 253, "c" * 253, 10**6, time.time() + 30, "u" * 36, time.time()),
    ]
    for e in entries:
        key = _key(e.namespace, e.name)
        assert len(key) + len(_value(e)) <= _size(key, e) <= len(key) + len(_value(e)) + 64
