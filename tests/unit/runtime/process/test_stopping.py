"""How a replica stops (§10): a signal drains first, and whatever ends the process ends it once."""

from __future__ import annotations

import asyncio
import signal

from cozygpu.runtime.process.stopping import Stopping


def test_a_signal_says_stopping_at_once_and_stops_kopf_only_after_the_drain() -> None:
    """Not ready and closing connections from the signal on; kopf's stop flag set once the drain has passed, and a
    second signal does not start the drain again."""

    async def run() -> tuple[bool, bool, bool]:
        shutdown = Stopping(0.05)
        shutdown.terminate()
        at_once = (shutdown.stopping, shutdown.stop.is_set())
        await asyncio.sleep(0.03)
        shutdown.terminate()
        await asyncio.wait_for(shutdown.stop.wait(), 1)
        return *at_once, shutdown.stop.is_set()

    assert asyncio.run(run()) == (True, False, True)


def test_the_process_is_ended_once_however_many_ask() -> None:
    """A dead task and a lost Lease at once raise one SIGTERM, which then drains like any signal."""
    raised: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: raised.append(signum))
    try:
        shutdown = Stopping(0.0)
        shutdown.end()
        shutdown.end()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert raised == [signal.SIGTERM]
