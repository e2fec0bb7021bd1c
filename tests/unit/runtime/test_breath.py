"""A long pass hands the event loop back as it goes (§14.3), by time and, where asked, by count."""

from __future__ import annotations

import asyncio

import pytest

from cozygpu.runtime import breath
from cozygpu.runtime.breath import Breath
from tests.support.workers import ticks_during


async def _ticks_during(calls: int, make: Breath) -> int:
    """How often another task ran while a pass called `make` this many times."""

    async def one_pass() -> None:
        for _ in range(calls):
            await make()

    return await ticks_during(one_pass)


def test_a_pass_asked_to_yields_every_so_many_objects_however_fast_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """With `every`, the loop is handed back after that many objects even when no time has passed."""
    monkeypatch.setattr(breath, "HELD_MOST", 3600.0)
    assert asyncio.run(_ticks_during(100, Breath(every=10))) == 10
    assert asyncio.run(_ticks_during(100, Breath())) == 0


def test_a_pass_that_held_the_loop_long_enough_yields_at_its_next_object(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past HELD_MOST at a stretch, the next object hands the loop back."""
    monkeypatch.setattr(breath, "HELD_MOST", 0.0)
    assert asyncio.run(_ticks_during(5, Breath())) == 5
