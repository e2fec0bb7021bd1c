"""The binder's template orders through the order ledger (§5.4, §7.4 across replicas, §10).

A template device is an order at bind time, and the binder's check (decisions.requests) sees
this process's reservations but not the held creates another replica admitted a moment ago.
So a bind that adds use in a namespace under a budget is counted in the view at once, as every
decision is (§13.1), and is confirmed in the ledger before its answer is written: the ledger
shows the orders other replicas admitted meanwhile; if with them a budget is overrun, the
newest of these binds are taken back (refused instead) until it is not, and the rest are
recorded, so a replica admitting after them counts them. The binds of one moment share one
ledger write (group commit): the binder never waits a round trip per bind. Called by
the binder's loop only (runtime.workers.binder).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog

from cozygpu.api import GPUDevice
from cozygpu.decisions import transitions
from cozygpu.decisions.budgets import Order, covering_budgets, overrun
from cozygpu.decisions.placement import NoPlacement, Placement
from cozygpu.decisions.requests import Answer, new_orders
from cozygpu.runtime.ledger import Claim, Ledger
from cozygpu.runtime.workers.binder.queue import WaitingRoom
from cozygpu.runtime.writes import Writer
from cozygpu.state.cluster import Cluster

log = structlog.get_logger("cozygpu.binder")


@dataclass(eq=False)
class _Bind:
    namespace: str
    orders: dict[Claim, Order]  # by device
    take_back: Callable[[str], None]  # refuse the bind instead, in the view at once (called synchronously)
    done: asyncio.Future[str | None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Confirmations:
    def __init__(
        self,
        cluster: Cluster,
        writer: Writer,
        ledger: Ledger,
        reserved: Callable[[], Sequence[Order]],
        queue: WaitingRoom,
    ) -> None:
        """`reserved`: this process's held orders not yet in the view; `queue`: the binder's waiting room, told of
        the room a bind taken back left."""
        self._cluster, self._writer, self._ledger = cluster, writer, ledger
        self._reserved, self._waiting_room = reserved, queue
        self._queue: list[_Bind] = []
        self._task: asyncio.Task[None] | None = None

    def orders_of(self, answer: Answer) -> dict[Claim, Order]:
        """The orders of a placement that another replica's admissions may not know of (none for a refusal)."""
        if not isinstance(answer.outcome, Placement) or not self._ledger.needed(answer.namespace):
            return {}
        uids = {d.name: d.metadata.uid or "" for d in answer.devices}
        return {(answer.namespace, n, uids[n]): o for n, o in new_orders(answer.namespace, answer.devices).items()}

    async def confirmed(
        self, answer: Answer, news: list[GPUDevice], tokens: list[int], orders: dict[Claim, Order]
    ) -> tuple[Answer, list[GPUDevice], list[int]]:
        """The answer to write once its orders are in the ledger (with its devices and assumption tokens): this
        one, or a refusal if it was taken back."""
        taken: list[tuple[Answer, list[GPUDevice], list[int]]] = []

        def take_back(why: str) -> None:
            # In the view at once, as any decision: the units go back to the node and the budgets.
            refused = [transitions.refused(d, answer.request.id, why) for d in answer.devices]
            assumptions = [self._writer.assume(new) for new in refused]
            self._waiting_room.gained(frozenset().union(*(a.room for a in assumptions)))
            refusal = Answer(answer.request, answer.namespace, answer.devices, NoPlacement(why))
            taken.append((refusal, refused, [a.token for a in assumptions]))

        await self.confirm(answer.namespace, orders, take_back)
        return taken[-1] if taken else (answer, news, tokens)

    async def confirm(self, namespace: str, orders: dict[Claim, Order], take_back: Callable[[str], None]) -> str | None:
        """Wait until the bind's orders are in the ledger (None), or it was taken back (why: `take_back` was
        called with it before anything else could decide)."""
        bind = _Bind(namespace, orders, take_back)
        self._queue.append(bind)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        return await asyncio.shield(bind.done)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            try:
                await self._ledger.record(functools.partial(self._decide, batch))
            except asyncio.CancelledError:
                for bind in [*batch, *self._queue]:
                    bind.done.cancel()  # the binder stopped: its writes are cancelled with it
                self._queue = []
                raise
            except Exception as e:  # the ledger could not be written: not confirmed is not admitted (fail closed)
                log.warning("binder.ledger_failed", error=str(e), binds=len(batch))
                # The API's words may name other tenants' orders: the tenant is told only what happened.
                self._fail(batch, "the order could not be recorded in the order ledger; try again")
            for bind in batch:
                if not bind.done.done():
                    bind.done.set_result(None)

    def _decide(self, batch: list[_Bind], others: list[Order]) -> tuple[None, dict[Claim, Order]]:
        """Take back the newest binds of the batch under an overrun budget until none is; record the rest."""
        extra = [*others, *self._reserved()]
        live = [b for b in batch if not b.done.done()]
        while live and (over := overrun(self._cluster, extra, {b.namespace for b in live})):
            # A bind gives way only to an overrun its own orders feed (a lowered limit of another class is not its).
            fed = [
                (b, o)
                for b in live
                for g in covering_budgets(self._cluster, b.namespace)
                if (o := over.get(g.key)) is not None and o.fed_by(b.orders.values())
            ]
            if not fed:
                break  # over without any of these binds: nothing of ours to take back
            victim = fed[-1][0]  # the newest; named by the first overrun it feeds
            self._take_back(victim, next(o.why for b, o in fed if b is victim))
            live.remove(victim)
        return None, {k: o for b in live for k, o in b.orders.items()}

    def _take_back(self, bind: _Bind, why: str) -> None:
        bind.take_back(why)
        bind.done.set_result(why)

    def _fail(self, batch: list[_Bind], why: str) -> None:
        for bind in batch:
            if not bind.done.done():
                self._take_back(bind, why)
