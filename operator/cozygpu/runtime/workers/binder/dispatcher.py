"""The binder's write slots (§13.1): decisions never run far ahead of the API.

A decision takes a slot before it reads the view (`slot`), so nothing changes between the decision and its
assumption in the view; if it writes, the slot goes with the write (`Slot.hand`) and is given back when the write
is done, and otherwise when the decision ends: in one place either way. Slots are half the API client's pool, so
admissions, the accountant and the collector keep the other half. Background work that holds no slot (the
moves' writes) is `spawn`ed here too, so all of it is cancelled with the binder (§10: a replica that lost the
Lease stops writing at once).

Called by the binder's loop and its mover (runtime.workers.binder).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any


class Slot:
    def __init__(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher
        self.handed = False

    def hand(self, write: Coroutine[Any, Any, None]) -> None:
        """The slot goes with `write`, run in the background; it is given back when the write is done."""
        self.handed = True
        self._dispatcher.spawn(self._dispatcher._holding(write))


class Dispatcher:
    def __init__(self, slots: int) -> None:
        self._slots = asyncio.Semaphore(max(1, slots))
        self._work: set[asyncio.Task[None]] = set()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[Slot]:
        """A slot for one decision: given back as the block ends unless handed to a write."""
        await self._slots.acquire()
        slot = Slot(self)
        try:
            yield slot
        finally:
            if not slot.handed:
                self._slots.release()

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Background work of the binder's, cancelled with it (`close`)."""
        task = asyncio.create_task(work)
        self._work.add(task)
        task.add_done_callback(self._work.discard)

    async def _holding(self, write: Coroutine[Any, Any, None]) -> None:
        try:
            await write
        finally:
            self._slots.release()

    async def close(self) -> None:
        """Cancel everything under way and wait for it to end."""
        work = list(self._work)
        for task in work:
            task.cancel()
        await asyncio.gather(*work, return_exceptions=True)
