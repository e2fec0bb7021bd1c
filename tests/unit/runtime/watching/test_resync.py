"""The resync (§6.4): every watched kind listed again through its informer, against the in-memory API.

The safety net for what no watch said: objects removed while no stream ran are forgotten,
and a list the API fails is tried again at the next interval (issue 20 item 7).
"""

from __future__ import annotations

import asyncio

from cozygpu.api import kinds
from cozygpu.kube.adapter import ApiError
from cozygpu.runtime.view import View
from cozygpu.runtime.watching.informer import Informer
from cozygpu.runtime.watching.resync import Resync
from cozygpu.state.cluster import Cluster
from tests.support.memkube import MemKube
from tests.support.views import A10, node
from tests.support.workers import run_until
from tests.support.writing import NS, device


def _resync() -> tuple[Resync, View, MemKube]:
    kube, view = MemKube(), View(Cluster())
    informers = [Informer(view, kube, k, timeout=240) for k in (kinds.NODE, kinds.GPU_DEVICE)]
    kube.put(kinds.NODE, node("n1", {A10: 1}))
    kube.put(kinds.NODE, node("n2", {A10: 1}))
    kube.put(kinds.GPU_DEVICE, device("d1"))
    kube.put(kinds.GPU_DEVICE, device("d2"))
    return Resync(informers), view, kube


def _holds(view: View) -> tuple[set[str], set[str]]:
    nodes = {n for n in ("n1", "n2") if view.cluster.knows(kinds.NODE, n)}
    devices = {d for d in ("d1", "d2") if view.cluster.devices.get((NS, d)) is not None}
    return nodes, devices


def test_a_resync_seeds_every_kind_and_then_forgets_what_each_lost_track_of() -> None:
    """The start-up resync fills the view; one later, after a node and a device went unseen, forgets those two."""
    resync, view, kube = _resync()
    assert asyncio.run(resync.once(resume=True)) == 0
    assert _holds(view) == ({"n1", "n2"}, {"d1", "d2"})
    kube.remove(kinds.NODE, "n2")
    kube.remove(kinds.GPU_DEVICE, "d2", NS)
    assert asyncio.run(resync.once()) == 2
    assert _holds(view) == ({"n1"}, {"d1"})


def test_a_periodic_resync_the_api_fails_is_tried_again_at_the_next_interval() -> None:
    """The first periodic list fails: `every` goes on, and the next interval's resync forgets the device."""
    resync, view, kube = _resync()
    asyncio.run(resync.once(resume=True))
    kube.remove(kinds.GPU_DEVICE, "d2", NS)
    kube.fail_next(ApiError(500, "InternalError", "etcd is away"), method="list")

    async def every() -> None:
        await resync.every(0.02)

    assert asyncio.run(run_until(every, lambda: view.cluster.devices.get((NS, "d2")) is None))
    assert kube.count("list") >= 2 + 1 + 2  # the start-up's two, the failed one, a whole resync after
    assert _holds(view) == ({"n1", "n2"}, {"d1"})
