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

import structlog

from cozygpu.api import GPUDevice
from cozygpu.decisions import transitions
from cozygpu.decisions.budgets import covering_budgets, overrun
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

    def orders_of(self, answer: Answer) -> dict[Claim, Order]:
        """The orders of a placement that another replica's admissions may not know of (none for a refusal)."""
        if not isinstance(answer.outcome, Placement):
            return {}
        ordered = new_orders(answer.namespace, answer.devices)
        if not self._charges.needed(answer.namespace, {o.class_name for o in ordered.values()}):
            return {}
        uids = {d.name: d.metadata.uid or "" for d in answer.devices}
        return {(answer.namespace, n, uids[n]): o for n, o in ordered.items()}

    async def confirmed(
        self, answer: Answer, news: list[GPUDevice], tokens: list[int], orders: dict[Claim, Order]
    ) -> tuple[Answer, list[GPUDevice], list[int]]:
        """The answer to write once its orders are charged (with its devices and assumption tokens): this one, or
        a refusal if it was taken back."""
        taken: list[tuple[Answer, list[GPUDevice], list[int]]] = []

        def take_back(why: str) -> None:
            # In the view at once, as any decision: the units go back to the node and the budgets.
            if taken:
                return
            refused = [transitions.refused(d, answer.request.id, why) for d in answer.devices]
            assumptions = [self._writer.assume(new) for new in refused]
            self._waiting_room.gained(frozenset().union(*(a.room for a in assumptions)))
            refusal = Answer(answer.request, answer.namespace, answer.devices, NoPlacement(why))
            taken.append((refusal, refused, [a.token for a in assumptions]))

        def decide(others: list[Order]) -> str | None:
            why = self._overrun(answer.namespace, orders, others)
            if why is not None:
                take_back(why)  # before the moment decides the next bind: that one counts the room
            return why

        try:
            await self._charges.charge(answer.namespace, orders, decide)
        except Exception as e:  # not charged is not admitted (fail closed)
            log.warning("binder.charge_failed", namespace=answer.namespace, request_id=answer.request.id, error=str(e))
            take_back(UNRECORDED)
        return taken[-1] if taken else (answer, news, tokens)

    def _overrun(self, namespace: str, claims: dict[Claim, Order], others: list[Order]) -> str | None:
        """Why the bind gives way: a budget covering its namespace that the view's use (this bind in it) plus the
        orders it does not count is over, by a class the bind's orders feed (a lowered limit of another is not its)."""
        over = overrun(self._cluster, [*others, *self._reserved()], {namespace})
        for budget in covering_budgets(self._cluster, namespace):
            found = over.get(budget.key)
            if found is not None and found.fed_by(claims.values()):
                return found.why
        return None
