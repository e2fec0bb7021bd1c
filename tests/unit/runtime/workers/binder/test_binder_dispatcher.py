"""The binder's write slots (runtime.workers.binder.dispatcher, §13.1): taken per decision, handed to its write,
given back in one place however the decision or the write ends."""

from __future__ import annotations

import asyncio

import pytest

from cozygpu.runtime.workers.binder.dispatcher import Dispatcher


def test_a_slot_not_handed_to_a_write_is_given_back_as_the_decision_ends() -> None:
    """A decision that writes nothing (it steps aside, the device waits) frees its slot at once, even by raising."""

    async def scenario() -> int:
        dispatcher = Dispatcher(1)
        async with dispatcher.slot():
            pass
        with pytest.raises(RuntimeError):
            async with dispatcher.slot():
                raise RuntimeError("a decision failed")
        async with asyncio.timeout(1):
            async with dispatcher.slot():
                return 1

    assert asyncio.run(scenario()) == 1


def test_a_handed_slot_is_held_until_its_write_ends_even_a_failing_one() -> None:
    """Decisions never run ahead of the API by more than the slots: the next waits for the write, not the
    decision; a write that fails gives its slot back too."""

    async def scenario() -> list[str]:
        dispatcher, order, release = Dispatcher(1), [], asyncio.Event()

        async def write() -> None:
            await release.wait()
            order.append("written")
            raise ConnectionError("the API went away")

        async with dispatcher.slot() as slot:
            slot.hand(write())
        order.append("decided")

        async def next_decision() -> None:
            async with dispatcher.slot():
                order.append("next decision")

        waiting = asyncio.create_task(next_decision())
        await asyncio.sleep(0.05)
        order.append("still waiting" if not waiting.done() else "ran ahead")
        release.set()
        await asyncio.wait_for(waiting, 1)
        return order

    assert asyncio.run(scenario()) == ["decided", "still waiting", "written", "next decision"]


def test_closing_cancels_the_writes_under_way() -> None:
    """§10: a binder that lost the Lease stops writing at once: what it spawned is cancelled."""

    async def scenario() -> bool:
        dispatcher = Dispatcher(2)
        forever = asyncio.Event()
        async with dispatcher.slot() as slot:
            slot.hand(forever.wait())  # type: ignore[arg-type]
        dispatcher.spawn(forever.wait())  # type: ignore[arg-type]
        await asyncio.sleep(0)
        async with asyncio.timeout(1):
            await dispatcher.close()
        return True

    assert asyncio.run(scenario())
