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

Versions before this one recorded every order in one ConfigMap, `cozy-gpu-orders`. A replica
starting takes over what it still holds (`take_over_ledger`) and counts those orders until they
expire, and leaves the ConfigMap where an older replica cannot write it (immutable, and the
chart's Role no longer lets it update it): in a rolling upgrade an older replica's budgeted
orders fail closed instead of being recorded where no newer replica looks.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from cozygpu.api import GPUBudget, kinds
from cozygpu.api.gpubudget import BudgetOrder
from cozygpu.api.meta import now as utcnow
from cozygpu.decisions import orders
from cozygpu.decisions.orders import Claim, Order
from cozygpu.kube.adapter import AlreadyExists, ApiError, AsyncKube
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


class Charges:
    def __init__(
        self,
        cluster: Cluster,
        writer: Writer,
        ttl: float,
        *,
        mine: Callable[[str, str, str], bool] = lambda namespace, name, uid: False,
        clock: Callable[[], dt.datetime] = utcnow,
    ) -> None:
        """`ttl`: how long an order whose device never comes stays charged. `mine`: orders this process counts
        already though its view does not (its reservations); what its binder decided and has not written yet
        (assumed in the view) it counts too."""
        self._cluster, self._writer, self._mine, self._clock = cluster, writer, mine, clock
        self._ttl = dt.timedelta(seconds=ttl)
        self._queues: dict[BudgetKey, list[_Turn]] = {}
        self._tasks: dict[BudgetKey, asyncio.Task[None]] = {}
        self._withdrawals: set[asyncio.Task[None]] = set()
        self.legacy: list[BudgetOrder] = []  # the retired ledger's orders, counted until they expire

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

    async def close(self) -> None:
        tasks = [*self._tasks.values(), *self._withdrawals]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _withdraw(self, keys: list[BudgetKey], claims: Mapping[Claim, Order]) -> None:
        """Take the orders off the budgets they were charged to, in the background (unless they expire first)."""
        for key in keys:
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
                for turn in [*batch, *self._queues.pop(key, [])]:
                    turn.done.cancel()
                raise
            except Exception as e:  # Busy, or the API's failure: each caller fails closed with it
                for turn in batch:
                    if not turn.done.done():
                        turn.done.set_exception(e)
        self._tasks.pop(key, None)

    async def _moment(self, key: BudgetKey, batch: list[_Turn]) -> None:
        """Decide every turn on one version of the budget, and write their orders in one status write."""
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
        # Written, nothing to write, or the budget is gone (it limits nothing now): each turn as it was decided.
        for turn in batch:
            if not turn.done.done():
                turn.done.set_result((turn.refused, turn.seen))

    async def _decide(self, budget: GPUBudget, batch: list[_Turn]) -> Step | None:
        now = self._clock()
        kept, others = orders.settle(self._cluster, budget.status.orders, now, self._mine)
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
            if turn.done.done():
                continue  # its caller gave up: left out
            if turn.decide is None:
                withdrawn |= turn.claims.keys()
                continue
            if turn.refused is None and len(kept) + len(new) + len(turn.claims) > RECORD_MOST:
                turn.refused = (
                    f"GPUBudget {budget.namespace}/{budget.name} has {len(kept) + len(new)} orders not yet counted,"
                    f" the most it records; retry once they are counted or have expired (within {self._ttl.seconds} s)"
                )
            if turn.refused is None:
                turn.seen = others
                try:
                    turn.refused = turn.decide(list({**turn.prior, **others}.values()))
                except Exception as e:  # one caller's failure is its own, not the moment's
                    turn.done.set_exception(e)
                    continue
            if turn.refused is None:
                new.update(turn.claims)
        entries = orders.recorded(kept, new, withdrawn, now + self._ttl)
        if entries == budget.status.orders:
            return None
        status = budget.status.model_copy(update={"orders": entries, "ordered_total": orders.in_flight(entries)})
        body: dict[str, Any] = budget.model_copy(update={"status": status}).wire()
        return lambda: self._writer.replace_status(kinds.GPU_BUDGET, body)


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
