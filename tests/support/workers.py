"""Workers over a fresh view, the one writer and the in-memory API, run until what a test waits for holds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from cozygpu.api import kinds
from cozygpu.runtime.events import Recorder
from tests.support.memkube import MemKube

WAIT = 3.0  # seconds: these passes take milliseconds; a test that waits this long has failed
SHORT = 0.3  # seconds a loop runs to show it leaves something alone


async def run_until(
    worker: Callable[[], Coroutine[Any, Any, None]], holds: Callable[[], bool], *, within: float = WAIT
) -> bool:
    """Run the worker's loop until `holds()` is true (True) or `within` seconds pass (False); then stop it.
    A check that something is *not* done passes a short `within`: a pass takes milliseconds."""
    task = asyncio.create_task(worker())
    deadline = time.monotonic() + within
    try:
        while not holds():
            if task.done():
                task.result()  # a loop that ended: its error is the test's
                return False
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.01)
        return True
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def until(holds: Callable[[], bool], within: float = 1.5) -> bool:
    """Whether `holds()` comes true within `within` seconds, looking every 10 ms, while other tasks run."""
    deadline = asyncio.get_running_loop().time() + within
    while not holds():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def beside(worker: Callable[[], Coroutine[Any, Any, None]], scenario: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Run `scenario()` with the worker's loop running beside it, in one event loop; the scenario's result."""

    async def both() -> Any:
        task = asyncio.create_task(worker())
        try:
            return await scenario()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    return asyncio.run(both())


def recorder(kube: MemKube) -> Recorder:
    return Recorder(kube)


async def posted(kube: MemKube, namespace: str, reason: str) -> int:
    """Events of `reason` in the API, once the recorder's posters had a moment to post what is queued."""
    await asyncio.sleep(0.05)
    return sum(1 for e in await kube.list(kinds.kind("Event"), namespace) if e["reason"] == reason)


async def ticks_during(work: Callable[[], Awaitable[object]]) -> int:
    """How often another task got the event loop while `work` ran: a long pass that never yields lets in none."""
    ticks, done = 0, False

    async def ticker() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    before = ticks
    await work()
    done = True
    await task
    return ticks - before
