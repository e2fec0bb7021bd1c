"""Background tasks that outlive any failure of the API or the network (§10).

Called by the Operator for each worker (binder, collector, accountant, resync, the pod
watch): `supervised` runs the worker, and if it ever raises, logs what failed
(`task.failed`, with the traceback), waits a capped, jittered backoff and runs it again.
Workers keep their queues on themselves, so a restart loses nothing they knew. While a
worker is between a failure and its restart, `Supervisor.failing` says so for /readyz.

`start` makes each task, supervised or not (leadership is not: a lost Lease ends the
process on purpose, and its task with it). A task that ends with an exception has really died:
`dead` says so for /healthz, and `on_death` is called once so the process ends and
the kubelet starts it afresh (§10).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

log = structlog.get_logger("cozygpu.operator")

BACKOFF = (0.5, 30.0)  # the first retry's delay and the cap, seconds
# A worker that ran this long since its last failure starts again from the first delay.
STEADY = 60.0


class Supervisor:
    def __init__(self, on_death: Callable[[], None] | None = None) -> None:
        self._failing: dict[str, str] = {}
        self._dead: dict[str, str] = {}
        self._on_death = on_death
        self.restarts = 0

    def failing(self) -> dict[str, str]:
        """Workers waiting to be started again after a failure, with what failed."""
        return dict(self._failing)

    def dead(self) -> dict[str, str]:
        """Tasks that ended with an exception, with what it was: the process cannot work without them."""
        return dict(self._dead)

    def start(
        self, name: str, run: Callable[[], Coroutine[Any, Any, None]], *, restart: bool = True
    ) -> asyncio.Task[None]:
        """The task for a worker: run again after any failure (`supervised`) unless `restart` is False."""
        task = asyncio.create_task(self.supervised(name, run) if restart else run(), name=name)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[None]) -> None:
        # Cancelled: stopped. Returned: its work ended on purpose (a supervised worker never returns).
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        why = f"failed: {str(error) or type(error).__name__}"
        first = not self._dead
        self._dead[task.get_name()] = why
        log.error("task.died", task=task.get_name(), how=why, exc_info=error)
        if first and self._on_death is not None:
            self._on_death()

    async def supervised(self, name: str, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        failures = 0
        while True:
            started = time.monotonic()
            try:
                await run()
                raise RuntimeError(f"{name} returned")  # workers run until cancelled
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if time.monotonic() - started > STEADY:
                    failures = 0
                failures += 1
                self.restarts += 1
                delay = min(BACKOFF[1], BACKOFF[0] * 2 ** min(failures - 1, 10)) * random.uniform(0.5, 1.0)
                why = str(e) or type(e).__name__
                self._failing[name] = why
                log.exception("task.failed", task=name, error=why, failures=failures, retry_in_s=round(delay, 2))
                await asyncio.sleep(delay)
                self._failing.pop(name, None)
