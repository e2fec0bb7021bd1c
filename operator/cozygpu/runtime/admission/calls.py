"""Admissions' API calls: one admission's at most a few in flight at once (issue 12 item 2), so a VMI with many
devices does not fill the shared pool; and every admission's taking `Turns` by namespace (issue 34 item 6), so
one tenant's burst of admissions does not queue every other tenant's calls behind its own.

Callers: the VMI webhook (runtime.admission.vmi_webhook).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import ParamSpec, TypeVar

T = TypeVar("T")
P = ParamSpec("P")


async def gather_outcomes(calls: Iterable[Awaitable[T]], limit: int) -> list[T | BaseException]:
    """Await every call, at most `limit` at once; each result or failure in its call's place."""
    gate = asyncio.Semaphore(limit)

    async def one(call: Awaitable[T]) -> T:
        async with gate:
            return await call

    return await asyncio.gather(*(one(c) for c in calls), return_exceptions=True)


async def gather_bounded(calls: Iterable[Awaitable[T]], limit: int) -> list[T]:
    """Await every call, at most `limit` at once, results in order; if any failed, raise the first failure
    once all are done (so the undo sees every write that did land)."""
    results = await gather_outcomes(calls, limit)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return [r for r in results if not isinstance(r, BaseException)]


class Turns:
    """Slots for API calls, handed out round robin by namespace once all are taken.

    The API client's pool serves calls first come, first served: a namespace with 128 admissions under way, a few
    calls each, put hundreds of calls ahead of another tenant's one. Here a call waits only while every slot is
    taken, and a slot freed goes to the namespace next in turn, so a tenant waits for at most one call of each
    other namespace that is waiting, however many that namespace queued. A lone tenant still has every slot.
    """

    def __init__(self, slots: int) -> None:
        self._free = slots
        # Waiting calls per namespace; the dict's order is the turn: a namespace served goes to the back.
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}

    @contextlib.asynccontextmanager
    async def turn(self, namespace: str) -> AsyncIterator[None]:
        """Hold a slot for one call of `namespace`."""
        if self._free and not self._waiting:
            self._free -= 1
        else:
            handed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(namespace, deque()).append(handed)
            try:
                await handed
            except asyncio.CancelledError:
                if handed.done() and not handed.cancelled():  # handed a slot, then cancelled: give it on
                    self._hand_on()
                raise
        try:
            yield
        finally:
            self._hand_on()

    async def call(self, namespace: str, fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)` in a turn of `namespace`."""
        async with self.turn(namespace):
            return await fn(*args, **kwargs)

    def _hand_on(self) -> None:
        """A slot freed: to the first waiting call of the namespace whose turn it is, else back to the free ones."""
        while self._waiting:
            namespace = next(iter(self._waiting))
            queue = self._waiting.pop(namespace)
            handed = queue.popleft()
            if queue:
                self._waiting[namespace] = queue  # to the back of the turn
            if not handed.done():  # a cancelled waiter is passed over
                handed.set_result(None)
                return
        self._free += 1
