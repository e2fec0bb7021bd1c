"""One admission's API calls, at most a few in flight at once (issue 12 item 2): a VMI with many devices must
not fill the shared pool and queue every other tenant's calls behind its own.

Callers: the VMI webhook (runtime.admission.vmi_webhook).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TypeVar

T = TypeVar("T")


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
