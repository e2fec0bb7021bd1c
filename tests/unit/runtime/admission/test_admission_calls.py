"""One admission's API calls (issue 12 item 2): bounded in flight, so a VMI with many devices leaves the
shared pool to other tenants' admissions; every call still runs, so an undo sees every write that landed."""

from __future__ import annotations

import asyncio

import pytest

from cozygpu.runtime.admission.calls import gather_bounded


def test_no_more_calls_than_the_limit_are_in_flight_and_results_keep_their_order() -> None:
    """64 calls under a limit of 4: never more than 4 running at once, each result in its call's place."""
    running, most = 0, 0

    async def call(i: int) -> int:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.001 * (i % 3))
        running -= 1
        return i

    assert asyncio.run(gather_bounded((call(i) for i in range(64)), 4)) == list(range(64))
    assert most == 4


def test_a_failed_call_is_raised_only_after_every_other_call_ran() -> None:
    """The first failure is raised once all are done: the writes after it still land and are known."""
    done: list[int] = []

    async def call(i: int) -> int:
        await asyncio.sleep(0)
        if i == 1:
            raise ValueError("call 1 failed")
        done.append(i)
        return i

    with pytest.raises(ValueError, match="call 1 failed"):
        asyncio.run(gather_bounded((call(i) for i in range(10)), 3))
    assert sorted(done) == [0, 2, 3, 4, 5, 6, 7, 8, 9]
