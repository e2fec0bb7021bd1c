"""How a replica stops (§10: an upgrade fails no admission).

SIGTERM and SIGINT drain first: the replica says it is `stopping` at once (not ready, and the
webhook server closes every connection after its answer, so the caller's next request opens one
to another replica), and `stop` is set `drain` seconds later, which stops kopf and lets the
requests under way finish. A task that really died, or a lost Lease, ends the process as such a
signal would (`end`), once. Built and read by the Operator (runtime.process.app); `stop` is kopf's
stop flag (runtime.process.handlers).
"""

from __future__ import annotations

import asyncio
import signal

import structlog

log = structlog.get_logger("cozygpu.operator")


class Stopping:
    def __init__(self, drain: float) -> None:
        """`drain`: seconds between the signal and kopf's stop (0 where no load balancer sends connections)."""
        self.stop = asyncio.Event()
        self.stopping = False
        self._drain = drain
        self._ending = False

    def on_signals(self) -> None:
        """Drain on SIGTERM and SIGINT (installed after kopf's own handlers: these replace them)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.terminate)

    def terminate(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        log.info("operator.draining", seconds=self._drain)
        asyncio.get_running_loop().call_later(self._drain, self.stop.set)

    def end(self) -> None:
        """Stop the process as SIGTERM would (kopf's cleanup runs), once whatever asks."""
        if not self._ending:
            self._ending = True
            signal.raise_signal(signal.SIGTERM)
