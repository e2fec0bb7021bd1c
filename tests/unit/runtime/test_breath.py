"""A long pass hands the event loop back as it goes (§14.3), by time and, where asked, by count."""

from __future__ import annotations

import asyncio

import pytest

from cozygpu.runtime import breath
from cozygpu.runtime.breath import Breath


async def _ticks_during(calls: int, make: Breath) -> int:
    """How often another task ran while a pass called `make` this many times."""
    ticks, done = 0, False

    async def ticker() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    before = ticks
    for _ in range(calls):
        await make()
    done = True
    await task
    return ticks - before


def test_a_pass_asked_to_yields_every_so_many_objects_however_fast_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """With `every`, the loop is handed back after that many objects even when no time has passed."""
    monkeypatch.setattr(breath, "HELD_MOST", 3600.0)
    assert asyncio.run(_ticks_during(100, Breath(every=10))) == 10
    assert asyncio.run(_ticks_during(100, Breath())) == 0


def test_a_pass_that_held_the_loop_long_enough_yields_at_its_next_object(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past HELD_MOST at a stretch, the next object hands the loop back."""
    monkeypatch.setattr(breath, "HELD_MOST", 0.0)
    assert asyncio.run(_ticks_during(5, Breath())) == 5
