"""Long passes hand the event loop back as they go (§14.3): one rule for every pass over many objects.

A pass of the binder, the collector or the accountant, or a moment of a budget's charges, decides
one object after another without an await that suspends when nothing needs a write; over a large
view that would hold the loop for the whole of it, and admissions, watches and probes would wait.
`Breath` lets them in after `HELD_MOST` seconds, or after `every` objects where a caller wants a
count that does not depend on the machine's speed.

Callers: runtime.workers.binder (its loop), runtime.workers.collector, runtime.workers.accountant,
runtime.charges.
"""

from __future__ import annotations

import asyncio
import time

HELD_MOST = 0.002  # seconds a pass may hold the event loop at a stretch


class Breath:
    def __init__(self, every: int | None = None) -> None:
        self._every = every
        self._count = 0
        self._since = time.monotonic()

    async def __call__(self) -> None:
        """One more object done: hand the loop back if this pass has held it long enough (or done `every`)."""
        self._count += 1
        if (self._every is not None and self._count % self._every == 0) or (
            time.monotonic() - self._since >= HELD_MOST
        ):
            await asyncio.sleep(0)
            self.restart()

    def restart(self) -> None:
        """The loop was handed back anyway (an await that suspended): time the next stretch from now."""
        self._since = time.monotonic()
