"""The resync (§6.4): every watched kind listed again, and the view made to agree with the API.

Called by the Operator once at start-up, where it seeds the view and each informer's
watch resumes from its list, and then every sweep interval by `Resync.every`: the
safety net for whatever a watch could not say. Each kind is listed by its informer
(runtime.watching.informer), so a list means the same thing everywhere.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import structlog

from cozygpu.runtime.watching.informer import Informer

log = structlog.get_logger("cozygpu.operator")

# The first periodic resync comes soon after start-up, then one every interval.
FIRST_RESYNC = 5.0


class Resync:
    def __init__(self, informers: Sequence[Informer]) -> None:
        self._informers = informers

    async def once(self, *, resume: bool = False) -> int:
        """List every kind and make the view agree; returns how many objects it had lost track of. With
        `resume`, each kind's watch continues from its list (start-up)."""
        forgotten, unchanged, started = 0, 0, time.monotonic()
        for informer in self._informers:
            lost, same = await informer.list(resume=resume)
            forgotten, unchanged = forgotten + lost, unchanged + same
        log.info(
            "view.resynced",
            forgotten=forgotten,
            unchanged=unchanged,
            duration_ms=round((time.monotonic() - started) * 1000, 1),
        )
        return forgotten

    async def every(self, interval: float) -> None:
        """Resync every `interval` seconds until cancelled. A failure of the API or the network is logged and
        the next interval tries again: the safety net never ends on its own."""
        await asyncio.sleep(min(FIRST_RESYNC, interval))
        while True:
            try:
                await self.once()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("view.resync_failed", error=str(e) or type(e).__name__)
            await asyncio.sleep(interval)
