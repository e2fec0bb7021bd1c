"""Background tasks that outlive any failure of the API or the network (§10).

Called by the Operator for each worker (binder, collector, accountant, resync, the pod
watch): `supervised` runs the worker, and if it ever raises, logs what failed
(`task.failed`, with the traceback), waits a capped, jittered backoff and runs it again.
Workers keep their queues on themselves, so a restart loses nothing they knew. While a
worker is between a failure and its restart, `Supervisor.failing` says so for /readyz.
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
    def __init__(self) -> None:
        self._failing: dict[str, str] = {}
        self.restarts = 0

    def failing(self) -> dict[str, str]:
        """Workers waiting to be started again after a failure, with what failed."""
        return dict(self._failing)

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
