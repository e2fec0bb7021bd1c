"""Orders charged to the budgets they spend (§7.4 across replicas, §10), as ResourceQuota charges its quotas.

Every synced replica admits held creates, and the leader's binder admits template orders at
bind time (§5.4); each process's own counting (reservations, the binder's assumptions) does not
see another's. So an order a budget can refuse (decisions.orders.charging) is recorded in the
status of each such GPUBudget covering its namespace, under that budget's resourceVersion,
before it is admitted: two replicas deciding on one version cannot both land, and the loser
decides again with the winner's order counted. Tenants who share no budget share no write, and
a namespace no budget covers writes nothing.

A budget's charges of one moment share one write (group commit): a tenant's burst costs its
budgets one write per moment, not one per create. A moment decides on the budget as the view
holds it (this process's writes go in through the writer, other replicas' by watch), and on a
conflict on what the API has now (`Writer.update`). An order spending several budgets is
charged to them one after another, by key; refused by one, it is withdrawn from the ones before.
Callers: runtime.admission.validation (held creates), runtime.workers.binder.confirmations
(template binds). The accountant prunes what the count has taken up since (decisions.usestatus).

A write per moment would still sit on the path of every create, and beside another tenant's burst
that write waits for the process (§13.5). So each moment also sets aside units on the budget
(`status.setAside`; how many: decisions.budgets.set_aside): this replica admits within them with
no write, every other replica counts them, and its next write of the budget (ahead of need, in
the background) records what it admitted within them as orders and sets aside again. An order
admitted within a set-aside is charged as long as one written on its own would be: this process
admits within units only while they stay recorded `ttl` longer. Units it stops using leave within
a window (decisions.budgets.WINDOW); a replica that dies leaves them to expire.

Orders an older version recorded in its one ConfigMap (runtime.process.ledger) count here too
(`legacy`) until they expire.

Why one module: a budget's set-asides are written in its moments, with its orders, and what is
admitted within them is what those moments write next; one budget's moments, queue and set-asides
are one state, decided in one order (how many units to set aside is decisions.budgets').
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from cozygpu.api import GPUBudget, kinds
from cozygpu.api.gpubudget import BudgetOrder, BudgetSetAside, GPUBudgetSpec
from cozygpu.api.meta import now as utcnow
from cozygpu.decisions import orders
from cozygpu.decisions.budgets import WINDOW, Held, set_aside
from cozygpu.decisions.orders import Claim, Order
from cozygpu.runtime.breath import Breath
from cozygpu.runtime.writes import Body, Outcome, State, Step, Writer
from cozygpu.state.cluster import Cluster

log = structlog.get_logger("cozygpu.charges")

# Writes a moment may lose to other writers of the same budget before its orders fail closed.
ATTEMPTS = 20
# Orders one budget records at once (at most about 450 bytes each): past that its own tenants' orders are refused
# until some are counted or expire, so creates that never come cannot make a budget's writes, and every replica's
# reading of them, grow without bound where its limits are large (§14). A burst's orders leave within a second.
RECORD_MOST = 512

BudgetKey = tuple[str, str]
# An order's check on one budget, with the orders recorded elsewhere that this process counts nowhere: the refusal.
Decide = Callable[[list[Order]], str | None]


class Busy(Exception):
    """Every attempt lost to another writer of the budget: the order is not admitted (fail closed)."""


@dataclass(eq=False)
class _Turn:
    """One order's charge to one budget (or, without `decide`, its withdrawal), decided in that budget's moment."""

    claims: Mapping[Claim, Order]
    decide: Decide | None
    prior: Mapping[Claim, Order]  # what the budgets charged before this one recorded
    done: asyncio.Future[tuple[str | None, dict[Claim, Order]]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    refused: str | None = None  # final once decided: a later read does not admit what one refused
    seen: dict[Claim, Order] = field(default_factory=dict)
    within: bool = False  # admitted within a set-aside that came while it waited: nothing to decide


@dataclass(eq=False)
class _Aside:
    """Units this process set aside on one budget for one class, as its last write of the budget recorded them."""

    units: int
    expires: dt.datetime
    spec: GPUBudgetSpec  # admitted within only under the limits they were set aside under (§7.3)
    taken: int = 0  # units admitted within them since that write

    def left(self) -> int:
        return self.units - self.taken


@dataclass(frozen=True)
class _Plan:
    """What a moment's write records of this process's set-asides: the orders admitted within them that it writes
    as orders, and the units set aside per class from then on (with when they expire)."""

    spec: GPUBudgetSpec
    written: frozenset[Claim]
    aside: Mapping[str, tuple[int, dt.datetime]]


class Charges:
    def __init__(
        self,
        cluster: Cluster,
        writer: Writer,
        ttl: float,
        *,
        mine: Callable[[str, str, str], bool] = lambda namespace, name, uid: False,
        reserved: Callable[[], Iterable[Order]] = tuple,
        holder: str = "",
        set_aside: int = 0,
        window: dt.timedelta = WINDOW,
        clock: Callable[[], dt.datetime] = utcnow,
    ) -> None:
        """`ttl`: how long an order whose device never comes stays charged. `mine`: orders this process counts
        already though its view does not (its reservations), `reserved` their orders; what its binder decided and
        has not written yet (assumed in the view) it counts too. `holder`: this process among the replicas (unique
        to its run); `set_aside`: the most units of a class it sets aside on a budget (0: none, a write per
        moment), and `window` how long it admits within them before it writes them again."""
        self._cluster, self._writer, self._mine, self._clock = cluster, writer, mine, clock
        self._reserved, self.holder, self._most, self._window = reserved, holder, set_aside if holder else 0, window
        self._ttl = dt.timedelta(seconds=ttl)
        self._queues: dict[BudgetKey, list[_Turn]] = {}
        self._tasks: dict[BudgetKey, asyncio.Task[None]] = {}
        self._withdrawals: set[asyncio.Task[None]] = set()
        self.legacy: list[BudgetOrder] = []  # the retired ledger's orders, counted until they expire
        self._aside: dict[BudgetKey, dict[str, _Aside]] = {}  # open to admit within, per budget and class
        self._unwritten: dict[BudgetKey, dict[Claim, Order]] = {}  # admitted within them, not yet written as orders
        self._plans: dict[BudgetKey, _Plan] = {}  # what the moment in flight decided last
        self._timers: dict[BudgetKey, asyncio.TimerHandle] = {}
        self._nudged: set[BudgetKey] = set()
        self._deciding: dict[BudgetKey, int] = {}  # orders a moment in flight admitted on the record, not yet written

    def needed(self, namespace: str, classes: Iterable[str]) -> bool:
        """Whether an order of these classes there is charged anywhere: a budget covering it can refuse it."""
        return bool(orders.charging(self._cluster, namespace, classes))

    async def charge(self, namespace: str, claims: Mapping[Claim, Order], decide: Decide) -> str | None:
        """Charge the orders to every budget that can refuse them, deciding on each with the orders recorded there
        (and on the budgets before it) that this process counts nowhere: the first refusal, or None once charged to
        all. A refusal, a failure (Busy, the API's) or a cancellation withdraws what was charged."""
        prior: dict[Claim, Order] = {}
        done: list[BudgetKey] = []
        try:
            for budget in orders.charging(self._cluster, namespace, {o.class_name for o in claims.values()}):
                if self._within(budget, claims):
                    done.append(budget.key)
                    continue
                problem, seen = await self._turn(budget.key, _Turn(claims, decide, dict(prior)))
                if problem is not None:
                    self._withdraw(done, claims)
                    return problem
                done.append(budget.key)
                prior.update(seen)
        except BaseException:
            self._withdraw(done, claims)
            raise
        return None

    def _within(self, budget: GPUBudget, claims: Mapping[Claim, Order]) -> bool:
        """Admit the orders within what this process set aside on the budget, if that holds them all (no await)."""
        key = budget.key
        aside = self._aside.get(key)
        if not aside:
            return False
        # What the budget's next write records stays within RECORD_MOST orders, as orders decided there do (§14).
        recording = len(budget.status.orders) + len(self._unwritten.get(key, {})) + self._deciding.get(key, 0)
        if recording + len(claims) > RECORD_MOST:
            return False
        need: dict[str, int] = {}
        for order in claims.values():
            if orders.charged(budget, order.class_name):
                need[order.class_name] = need.get(order.class_name, 0) + order.count
        usable = self._clock() + self._ttl  # each order stays charged `ttl` at least, as one written on its own
        # Only units the budget as seen still records as this process's: not those of a budget deleted and made
        # again under its name, nor ones another writer dropped.
        recorded = self._recorded_mine(budget)
        for class_name, units in need.items():
            got = aside.get(class_name)
            if got is None or got.spec != budget.spec or got.expires < usable or got.left() < units:
                return False
            if (class_name, got.units, got.expires) not in recorded:
                return False
        for class_name, units in need.items():
            aside[class_name].taken += units
        self._unwritten.setdefault(key, {}).update(claims)
        # Written again before it runs out, or its window ends: the next orders find it renewed.
        late = usable + self._window / 2
        if any(aside[c].left() * 2 < aside[c].units or aside[c].expires < late for c in need):
            self._nudge(key)
        return True

    def _nudge(self, key: BudgetKey) -> None:
        """A moment of the budget with no order of its own: what was admitted within its set-asides written, and
        they set aside again, or let go."""
        if key in self._nudged:
            return
        self._nudged.add(key)
        self._turn(key, _Turn({}, None, {})).add_done_callback(_quiet)

    def _timer(self, key: BudgetKey) -> None:
        """Look at the budget again when the first of its set-asides stops being usable."""
        if (old := self._timers.pop(key, None)) is not None:
            old.cancel()
        aside = self._aside.get(key)
        if not aside:
            return
        ends = min(a.expires for a in aside.values()) - self._ttl
        delay = max(0.0, (ends - self._clock()).total_seconds())
        self._timers[key] = asyncio.get_running_loop().call_later(delay, self._nudge, key)

    async def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        tasks = [*self._tasks.values(), *self._withdrawals]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _withdraw(self, keys: list[BudgetKey], claims: Mapping[Claim, Order]) -> None:
        """Take the orders off the budgets they were charged to, in the background (unless they expire first);
        those admitted within a set-aside and not written yet go back to it at once."""
        for key in keys:
            unwritten = self._unwritten.get(key, {})
            if claims.keys() <= unwritten.keys():
                aside = self._aside.get(key, {})
                for claim, order in claims.items():
                    del unwritten[claim]
                    if (got := aside.get(order.class_name)) is not None:
                        got.taken = max(0, got.taken - order.count)
                continue
            task = asyncio.get_running_loop().create_task(self._withdrawal(key, claims))
            self._withdrawals.add(task)
            task.add_done_callback(self._withdrawals.discard)

    async def _withdrawal(self, key: BudgetKey, claims: Mapping[Claim, Order]) -> None:
        try:
            await self._turn(key, _Turn(claims, None, {}))
        except Exception as e:  # left to expire: the record is bounded by the budget's limits and the ttl
            log.warning("charges.withdraw_failed", namespace=key[0], budget=key[1], error=str(e))

    def _turn(self, key: BudgetKey, turn: _Turn) -> asyncio.Future[tuple[str | None, dict[Claim, Order]]]:
        self._queues.setdefault(key, []).append(turn)
        task = self._tasks.get(key)
        if task is None or task.done():
            self._tasks[key] = asyncio.get_running_loop().create_task(self._run(key))
        return turn.done

    async def _run(self, key: BudgetKey) -> None:
        """The budget's moments, one at a time, while turns wait for it."""
        while batch := self._queues.pop(key, None):
            try:
                await self._moment(key, batch)
            except asyncio.CancelledError:
                self._nudged.discard(key)
                for turn in [*batch, *self._queues.pop(key, [])]:
                    turn.done.cancel()
                raise
            except Exception as e:  # Busy, or the API's failure: each caller fails closed with it
                # Whether the write landed is not known: admit within no set-aside of the budget until one does.
                self._aside.pop(key, None)
                self._timer(key)
                for turn in batch:
                    if turn.within:  # not admitted after all: not to be written as orders later either
                        for claim in turn.claims:
                            self._unwritten.get(key, {}).pop(claim, None)
                    if not turn.done.done():
                        turn.done.set_exception(e)
            finally:
                self._plans.pop(key, None)
                self._deciding.pop(key, None)
        self._tasks.pop(key, None)

    async def _moment(self, key: BudgetKey, batch: list[_Turn]) -> None:
        """Decide every turn on one version of the budget, and write their orders in one status write."""
        self._nudged.discard(key)
        budget = self._cluster.budgets.get(key)
        # First on the view's copy as it is (no body read or parsed), then on what the API has, as Writer.update does.
        step = None if budget is None else await self._decide(budget, batch)
        outcome = Outcome(State.CURRENT) if step is None else await step()
        if outcome.state is State.CONFLICT:

            async def decide(current: Body | None) -> Step | None:
                return None if current is None else await self._decide(GPUBudget.from_wire(current), batch)

            outcome = await self._writer.update(outcome.body, decide, tries=ATTEMPTS - 1)
        if outcome.state is State.CONFLICT:
            raise Busy(f"GPUBudget {key[0]}/{key[1]} is busy; try again")
        plan = self._plans.pop(key, None) if outcome.state is not State.GONE else None
        if plan is not None and outcome.written and outcome.body is not None:
            plan = self._kept(key, plan, GPUBudget.from_wire(outcome.body))
        self._recorded(key, plan)
        # Written, nothing to write, or the budget is gone (it limits nothing now): each turn as it was decided.
        for turn in batch:
            if not turn.done.done():
                turn.done.set_result((turn.refused, turn.seen))

    def _kept(self, key: BudgetKey, plan: _Plan, stored: GPUBudget) -> _Plan:
        """The plan's set-asides that the API server stored as written: one whose GPUBudget definition predates them
        drops `status.setAside` from the write, and units it does not hold are not admitted within."""
        held = self._recorded_mine(stored)
        kept = {c: (units, expires) for c, (units, expires) in plan.aside.items() if (c, units, expires) in held}
        if kept != plan.aside:
            log.warning(
                "budget.set_aside_dropped",
                namespace=key[0],
                budget=key[1],
                why="the API server did not store status.setAside: apply the operator's CRDs (crds/)",
            )
        return _Plan(plan.spec, plan.written, kept)

    def _recorded_mine(self, budget: GPUBudget) -> set[tuple[str, int, dt.datetime]]:
        """This process's set-asides as the budget records them: (class, units, expiry)."""
        return {(a.class_name, a.units, a.expires) for a in budget.status.set_aside if a.holder == self.holder}

    def _recorded(self, key: BudgetKey, plan: _Plan | None) -> None:
        """The budget holds what the moment decided: the orders it wrote leave this process's unwritten ones, and
        its set-asides are the ones written, less what was admitted within the old ones since the decision."""
        if plan is None:  # the budget is gone: nothing to admit within
            self._aside.pop(key, None)
            self._unwritten.pop(key, None)
        else:
            unwritten = self._unwritten.get(key, {})
            for claim in plan.written:
                unwritten.pop(claim, None)
            if not unwritten:
                self._unwritten.pop(key, None)
            aside = {}
            for class_name, (units, expires) in plan.aside.items():
                taken = sum(o.count for o in unwritten.values() if o.class_name == class_name)
                aside[class_name] = _Aside(units, expires, plan.spec, taken)
            if aside:
                self._aside[key] = aside
            else:
                self._aside.pop(key, None)
        self._timer(key)

    async def _decide(self, budget: GPUBudget, batch: list[_Turn]) -> Step | None:
        now = self._clock()
        kept, others = orders.settle(self._cluster, budget.status.orders, now, self._mine)
        theirs = [a for a in orders.live(budget.status.set_aside, now) if a.holder != self.holder]
        others.update(orders.set_aside_orders(budget, ((a.holder, a.class_name, a.units) for a in theirs)))
        # Orders that waited for this moment may fit what the last one set aside; the classes of the others were not
        # admitted within it: it stops taking orders until written.
        for turn in batch:
            if turn.decide is not None and not turn.within and not turn.done.done():
                turn.within = self._within(budget, turn.claims)
        ordering = {o.class_name for t in batch if t.decide is not None and not t.within for o in t.claims.values()}
        aside = self._aside.get(budget.key, {})
        for class_name in ordering & aside.keys():
            del aside[class_name]
        left = orders.set_aside_orders(budget, ((self.holder, c, a.left()) for c, a in aside.items()))
        if self.legacy:
            self.legacy = [e for e in self.legacy if e.expires > now]
            covered = [
                e for e in self.legacy if any(b.key == budget.key for b in self._cluster.budgets.covering(e.namespace))
            ]
            others.update(orders.settle(self._cluster, covered, now, self._mine)[1])
        new: dict[Claim, Order] = {}
        withdrawn: set[Claim] = set()
        breathe = Breath(every=32)  # a burst's moment decides many orders: the loop serves others meanwhile
        # Newest first: of binds that together overrun the budget, the newest gives way (the older ones stay).
        for turn in reversed(batch):
            await breathe()
            if turn.done.done() or turn.within:
                continue  # its caller gave up: left out; or written below with what was admitted within
            if turn.decide is None:
                withdrawn |= turn.claims.keys()
                continue
            recording = len(kept) + len(self._unwritten.get(budget.key, {})) + len(new)
            if turn.refused is None and recording + len(turn.claims) > RECORD_MOST:
                turn.refused = (
                    f"GPUBudget {budget.namespace}/{budget.name} has {recording} orders not yet counted,"
                    f" the most it records; retry once they are counted or have expired (within {self._ttl.seconds} s)"
                )
            if turn.refused is None:
                try:
                    left = _judge(turn, turn.decide, others, left, aside)
                except Exception as e:  # one caller's failure is its own, not the moment's
                    turn.done.set_exception(e)
                    continue
            if turn.refused is None:
                new.update(turn.claims)
                self._deciding[budget.key] = len(new)
        unwritten = dict(self._unwritten.get(budget.key, {}))
        admitted = {o.class_name for o in new.values()}
        held = {c: Held(a.units, a.taken, a.expires) for c, a in aside.items()}
        counted = [*others.values(), *self._reserved()]
        kept_aside = set_aside(
            self._cluster, budget, held, admitted, counted, now=now, ttl=self._ttl, most=self._most, window=self._window
        )
        for class_name in aside.keys() - kept_aside.keys() - admitted:
            del aside[class_name]  # unused through its time: let go, and admitted within no more
        plan = _Plan(budget.spec, frozenset(unwritten), kept_aside)
        self._plans[budget.key] = plan
        entries = orders.recorded(kept, {**unwritten, **new}, withdrawn, now + self._ttl)
        ours = [
            BudgetSetAside(holder=self.holder, class_name=c, units=units, expires=expires)
            for c, (units, expires) in sorted(plan.aside.items())
        ]
        if entries == budget.status.orders and [*theirs, *ours] == budget.status.set_aside:
            return None
        status = budget.status.model_copy(
            update={
                "orders": entries,
                "ordered_total": orders.in_flight(entries),
                "set_aside": [*theirs, *ours],
                "set_aside_total": orders.in_flight([*theirs, *ours]),
            }
        )
        body: dict[str, Any] = budget.model_copy(update={"status": status}).wire()
        return lambda: self._writer.replace_status(kinds.GPU_BUDGET, body)


def _judge(
    turn: _Turn, decide: Decide, others: dict[Claim, Order], left: dict[Claim, Order], aside: dict[str, _Aside]
) -> dict[Claim, Order]:
    """Decide a turn's orders with every other order counted, and this process's own unused units (`left`, of
    `aside`). Refused with those counted, they go, not the order (one replica never refuses for units it holds
    unused): nothing is admitted within them from here, and the moment's write records their going. What is left."""
    turn.seen = {**others, **left}
    turn.refused = decide(list({**turn.prior, **turn.seen}.values()))
    if turn.refused is None or not left:
        return left
    aside.clear()
    turn.seen = dict(others)
    turn.refused = decide(list({**turn.prior, **turn.seen}.values()))
    return {}


def _quiet(done: asyncio.Future[Any]) -> None:
    """A moment nobody waits for: its failure was logged by the callers that waited, or is retried by the next."""
    if not done.cancelled():
        done.exception()
