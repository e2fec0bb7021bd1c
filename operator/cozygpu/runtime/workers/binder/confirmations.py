"""The binder's template orders charged to their budgets (§5.4, §7.4 across replicas, §10).

A template device is an order at bind time, and the binder's check (decisions.requests) sees
this process's reservations but not the held creates another replica admitted a moment ago.
So a bind that adds use under a budget that can refuse it is counted in the view at once, as
every decision is (§13.1), and is charged to those budgets (runtime.charges) before its answer
is written: each budget's record shows the orders other replicas admitted meanwhile; if with
them the budget is overrun by what the bind feeds, the bind is taken back (refused instead),
newest first, and otherwise it is recorded there, so a replica admitting after it counts it.
The binds of one moment on a budget share one write (group commit): the binder never waits a
round trip per bind. Called by the binder's loop only (runtime.workers.binder).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from cozygpu.api import GPUDevice
from cozygpu.decisions import transitions
from cozygpu.decisions.budgets import Overrun, covering_budgets, overrun
from cozygpu.decisions.orders import Claim, Order
from cozygpu.decisions.placement import NoPlacement, Placement
from cozygpu.decisions.requests import Answer, new_orders
from cozygpu.runtime.charges import Charges
from cozygpu.runtime.workers.binder.queue import WaitingRoom
from cozygpu.runtime.writes import Writer
from cozygpu.state.cluster import Cluster

log = structlog.get_logger("cozygpu.binder")

# The API's words may name other tenants' orders: the tenant is told only what happened.
UNRECORDED = "the order could not be charged to its GPUBudget; try again"


@dataclass(eq=False)
class Bind:
    """A template bind counted in the view whose orders are not charged yet; `taken`: the refusal written instead,
    once it was taken back (with its devices and assumption tokens)."""

    answer: Answer
    orders: dict[Claim, Order]
    taken: tuple[Answer, list[GPUDevice], list[int]] | None = None


class Confirmations:
    def __init__(
        self,
        cluster: Cluster,
        writer: Writer,
        charges: Charges,
        reserved: Callable[[], Sequence[Order]],
        queue: WaitingRoom,
    ) -> None:
        """`reserved`: this process's held orders not yet in the view; `queue`: the binder's waiting room, told of
        the room a bind taken back left."""
        self._cluster, self._writer, self._charges = cluster, writer, charges
        self._reserved, self._waiting_room = reserved, queue
        # Binds counted in the view and not yet charged, in the order they were decided: of those an overrun is
        # fed by, the newest gives way, whichever of them a budget's moment is deciding (moments need not hold all).
        self._in_flight: list[Bind] = []

    def orders_of(self, answer: Answer) -> Bind | None:
        """The bind of a placement whose orders another replica's admissions may not know of, in flight from now
        (None for a refusal, or where no budget can refuse them). Called when the bind is decided."""
        if not isinstance(answer.outcome, Placement):
            return None
        ordered = new_orders(answer.namespace, answer.devices)
        if not self._charges.needed(answer.namespace, {o.class_name for o in ordered.values()}):
            return None
        uids = {d.name: d.metadata.uid or "" for d in answer.devices}
        bind = Bind(answer, {(answer.namespace, n, uids[n]): o for n, o in ordered.items()})
        self._in_flight.append(bind)
        return bind

    async def confirmed(
        self, bind: Bind, news: list[GPUDevice], tokens: list[int]
    ) -> tuple[Answer, list[GPUDevice], list[int]]:
        """The answer to write once the bind's orders are charged (with its devices and assumption tokens): its
        own, or a refusal if it was taken back."""
        refused: str | None = None
        try:
            if bind.taken is None:  # taken back for an older bind meanwhile: nothing to charge
                refused = await self._charges.charge(
                    bind.answer.namespace, bind.orders, lambda others: self._decide(bind, others)
                )
        except Exception as e:  # not charged is not admitted (fail closed)
            answer = bind.answer
            log.warning("binder.charge_failed", namespace=answer.namespace, request_id=answer.request.id, error=str(e))
            refused = UNRECORDED
        finally:
            self._in_flight.remove(bind)
        if refused is not None:
            self._take_back(bind, refused)
        return bind.taken or (bind.answer, news, tokens)

    def _decide(self, bind: Bind, others: list[Order]) -> str | None:
        """The bind's check on one budget's moment: while the view's use (every bind in flight in it) plus the
        orders it does not count overruns a budget covering the bind's namespace by a class the bind feeds, the
        newest bind in flight that feeds it is taken back, in the view at once; the refusal if it was this one."""
        while bind.taken is None:
            found = self._overrun(bind, others)
            if found is None:
                return None
            key, over = found
            victim = next(
                b
                for b in reversed(self._in_flight)
                if b.taken is None
                and over.fed_by(b.orders.values())
                and any(g.key == key for g in covering_budgets(self._cluster, b.answer.namespace))
            )
            self._take_back(victim, over.why)
        return bind.taken[0].outcome.message if isinstance(bind.taken[0].outcome, NoPlacement) else None

    def _overrun(self, bind: Bind, others: list[Order]) -> tuple[tuple[str, str], Overrun] | None:
        """A budget covering the bind's namespace that the view's use plus the orders it does not count is over, by
        a class the bind's orders feed (a lowered limit of another class is not its)."""
        namespace = bind.answer.namespace
        over = overrun(self._cluster, [*others, *self._reserved()], {namespace})
        for budget in covering_budgets(self._cluster, namespace):
            found = over.get(budget.key)
            if found is not None and found.fed_by(bind.orders.values()):
                return budget.key, found
        return None

    def _take_back(self, bind: Bind, why: str) -> None:
        """Refuse the bind instead, in the view at once, as any decision: the units go back to the node and the
        budgets. Once."""
        if bind.taken is not None:
            return
        answer = bind.answer
        refused = [transitions.refused(d, answer.request.id, why) for d in answer.devices]
        assumptions = [self._writer.assume(new) for new in refused]
        self._waiting_room.gained(frozenset().union(*(a.room for a in assumptions)))
        refusal = Answer(answer.request, answer.namespace, answer.devices, NoPlacement(why))
        bind.taken = (refusal, refused, [a.token for a in assumptions])
