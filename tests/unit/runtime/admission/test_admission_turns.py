"""Admissions take their API calls in turns by namespace (issue 34 item 6, §14.3): one tenant's burst of admissions,
each a few calls, does not queue another tenant's calls behind all of its own at the API client's pool."""

from __future__ import annotations

import asyncio
from typing import Any

from cozygpu.api import kinds
from cozygpu.api.kinds import Kind
from cozygpu.runtime.admission.calls import Turns
from cozygpu.runtime.admission.reservations import Reservations
from cozygpu.runtime.admission.vmi_webhook import VMIAdmission
from cozygpu.runtime.admission.waiters import Waiters
from tests.support.bodies import vmi_body
from tests.support.memkube import MemKube
from tests.support.views import A10, gpu_class, node
from tests.support.writing import writer

Body = dict[str, Any]
POOL = 4  # the API client's connections, served first come, first served as its thread pool is
BURST = 30  # the noisy tenant's admissions, two reads each


class Pool:
    """Reads through a first-come, first-served pool of `POOL` connections, each a moment long; notes the namespace
    of every read as it gets a connection."""

    def __init__(self, kube: MemKube) -> None:
        self.served: list[str] = []
        self._gate = asyncio.Semaphore(POOL)
        self._read = kube.get_or_none

    async def __call__(self, kind: Kind, name: str, namespace: str | None = None) -> Body | None:
        async with self._gate:
            self.served.append(namespace or "")
            await asyncio.sleep(0.001)
            return await self._read(kind, name, namespace)


def _vmi(name: str, namespace: str) -> Body:
    return vmi_body(name, namespace, [{"deviceTemplate": {"className": "a10", "count": 1}}])


async def _quiet_tenants_wait(turns: Turns | None) -> int:
    """How many of the noisy tenant's reads got a connection after the quiet tenant's admission arrived and before
    its first read did."""
    w, view, kube = writer()
    view.apply(kinds.NODE, node("n1", {A10: 8}))
    view.apply(kinds.GPU_CLASS, kube.put(kinds.GPU_CLASS, gpu_class("a10")))
    pool = Pool(kube)
    kube.get_or_none = pool  # type: ignore[method-assign]
    admission = VMIAdmission(
        view.cluster, Waiters(), Reservations(ttl=30), bind_timeout=0.1, max_devices=8, writer=w, turns=turns
    )
    noisy = [asyncio.create_task(admission.admit(_vmi(f"a{i}", "noisy"), dry_run=True)) for i in range(BURST)]
    while len(pool.served) < POOL:  # the burst holds every connection, and the rest of it waits
        await asyncio.sleep(0)
    arrived = len(pool.served)
    await admission.admit(_vmi("b", "quiet"), dry_run=True)
    await asyncio.gather(*noisy)
    return pool.served.index("quiet") - arrived


def test_a_quiet_tenants_call_waits_for_one_turn_not_for_a_burst() -> None:
    """Beside another namespace's burst of 30 admissions (60 reads) over a pool of 4, the quiet tenant's first read
    gets a connection after at most one of the burst's, where first come, first served put most of it ahead."""
    assert asyncio.run(_quiet_tenants_wait(Turns(POOL))) <= 1
    # The same run with no turns (every call straight to the pool): the measure tells the difference.
    assert asyncio.run(_quiet_tenants_wait(Turns(10_000))) >= BURST


def test_a_lone_tenant_has_every_slot() -> None:
    """Turns ration only when slots run out: one namespace alone holds all of them at once."""

    async def most_at_once() -> int:
        turns, running, most = Turns(3), 0, 0

        async def call() -> None:
            nonlocal running, most
            async with turns.turn("only"):
                running += 1
                most = max(most, running)
                await asyncio.sleep(0.001)
                running -= 1

        await asyncio.gather(*(call() for _ in range(10)))
        return most

    assert asyncio.run(most_at_once()) == 3


def test_a_freed_slot_goes_round_robin_and_skips_a_cancelled_waiter() -> None:
    """With every slot taken, freed slots go to the waiting namespaces in turn (a, b, c, a, ...), not in arrival
    order; a waiter cancelled while it waited is passed over and its slot is not lost."""

    async def order() -> tuple[list[str], int]:
        turns = Turns(1)
        served: list[str] = []
        release = asyncio.Event()

        async def call(namespace: str) -> None:
            async with turns.turn(namespace):
                served.append(namespace)
                if namespace == "first":
                    await release.wait()

        first = asyncio.create_task(call("first"))
        await asyncio.sleep(0)
        waiting = [asyncio.create_task(call(ns)) for ns in ("a", "a", "a", "b", "gone", "c")]
        await asyncio.sleep(0)
        waiting[4].cancel()
        release.set()
        await asyncio.gather(first, *waiting, return_exceptions=True)
        # Every slot came back: one more call runs at once.
        await asyncio.wait_for(call("after"), 1)
        return served, len(served)

    served, count = asyncio.run(order())
    assert served == ["first", "a", "b", "c", "a", "a", "after"]
    assert count == 7
