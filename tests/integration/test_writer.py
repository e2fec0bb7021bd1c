"""The one writer (runtime.writes) against the real API server: what "gone" it reads into the view.

A NotFound answers for the moment the call was made. A create of the same name whose response
reaches the view while the call is in flight is another object, and must stay: a forget by name
dropped it and buried it at its own version, so no later list or resync could bring it back
(found by the stop/start soak: a restarted VM's new template device vanished from the view, its
uid was never recorded, and its launcher pod was refused for good).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cozygpu.api import kinds
from cozygpu.kube.adapter import Kube, ThreadedKube
from cozygpu.runtime.view import View
from cozygpu.runtime.writes import Writer
from cozygpu.state.cluster import Cluster
from tests.support.bodies import gpu_device_body
from tests.support.nodes import Gpu
from tests.support.operators import unregister_webhooks

pytestmark = pytest.mark.integration


@pytest.fixture
def writer(kube: Kube) -> tuple[Writer, View]:
    # A killed --dev operator may have left its webhooks: nothing here goes through them.
    unregister_webhooks(kube)
    view = View(Cluster())
    return Writer(view, ThreadedKube(kube, workers=2)), view


def _newer(body: dict[str, Any]) -> dict[str, Any]:
    """The same name as another object, as a create's response would carry it."""
    meta = {**body["metadata"], "uid": "another-object", "resourceVersion": str(10**12)}
    return {**body, "metadata": meta}


def _meanwhile(view: View, body: dict[str, Any], call: Any) -> None:
    async def scenario() -> None:
        task = asyncio.create_task(call)
        await asyncio.sleep(0)  # the call is now waiting on the API in a thread
        view.apply(kinds.GPU_DEVICE, body)
        await task

    asyncio.run(scenario())


def test_a_read_finding_nothing_leaves_an_object_of_the_name_that_arrived_meanwhile(
    writer: tuple[Writer, View], kube: Kube, namespace: str, gpu: Gpu
) -> None:
    """read: the GET finds no object; a create's response for the name lands meanwhile: the view keeps it."""
    w, view = writer
    body = gpu_device_body("d", namespace, gpu.cls)
    _meanwhile(view, _newer(body), w.read(kinds.GPU_DEVICE, "d", namespace))
    kept = view.cluster.devices.get((namespace, "d"))
    assert kept is not None and kept.metadata.uid == "another-object"


def test_a_delete_finding_nothing_leaves_an_object_of_the_name_that_arrived_meanwhile(
    writer: tuple[Writer, View], kube: Kube, namespace: str, gpu: Gpu
) -> None:
    """delete: the old object is already gone (404); the new one's create response lands meanwhile: kept."""
    w, view = writer
    old = kube.create(kinds.GPU_DEVICE, gpu_device_body("d", namespace, gpu.cls))
    view.apply(kinds.GPU_DEVICE, old)
    kube.delete(kinds.GPU_DEVICE, "d", namespace)
    _meanwhile(view, _newer(old), w.delete(kinds.GPU_DEVICE, "d", namespace, uid=old["metadata"]["uid"]))
    kept = view.cluster.devices.get((namespace, "d"))
    assert kept is not None and kept.metadata.uid == "another-object"


def test_what_the_view_held_when_asked_is_forgotten(
    writer: tuple[Writer, View], kube: Kube, namespace: str, gpu: Gpu
) -> None:
    """The plain case still holds: an object the API no longer has, unchanged meanwhile, leaves the view."""
    w, view = writer
    old = kube.create(kinds.GPU_DEVICE, gpu_device_body("d", namespace, gpu.cls))
    view.apply(kinds.GPU_DEVICE, old)
    kube.delete(kinds.GPU_DEVICE, "d", namespace)
    asyncio.run(w.read(kinds.GPU_DEVICE, "d", namespace))
    assert view.cluster.devices.get((namespace, "d")) is None
