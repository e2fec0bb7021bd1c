"""The collector (§6) driven through the view and the one writer, against the in-memory API.

Each test puts objects in the API and the view as a watch would, runs the collector's loop
until the API shows what §6 says, and checks what it wrote (and what it did not).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

from cozygpu.api import kinds
from cozygpu.api.meta import now
from cozygpu.api.names import API_VERSION, FINALIZER_IN_USE, LABEL_TEMPLATE_DEVICE, TRUE
from cozygpu.runtime.view import View
from cozygpu.runtime.workers.collector import Collector
from cozygpu.runtime.writes import Writer
from tests.support.memkube import MemKube
from tests.support.workers import SHORT, posted, recorder, run_until, ticks_during
from tests.support.writing import NS, device, writer

GRACE = 60.0
Body = dict[str, Any]


def _collector() -> tuple[Collector, Writer, View, MemKube]:
    w, view, kube = writer()
    collector = Collector(view.cluster, w, recorder(kube), grace=GRACE, sweep_interval=3600)
    view.subscribe(collector.changed, kinds.GPU_DEVICE, kinds.VMI, kinds.GPU_CLASS, kinds.POD)
    return collector, w, view, kube


def _ago(seconds: float) -> str:
    return (now() - dt.timedelta(seconds=seconds)).isoformat()


def _attached(name: str, vmi: str, uid: str | None, *, template: bool = False, finalizer: bool = False) -> Body:
    body = device(name, finalizers=[FINALIZER_IN_USE] if finalizer else None)
    if template:
        body["metadata"]["labels"] = {LABEL_TEMPLATE_DEVICE: TRUE}
    body["status"] = {"attachedTo": {"vmi": vmi, "since": _ago(1), **({"uid": uid} if uid else {})}}
    return body


def _seen(view: View, kube: MemKube, body: Body) -> Body:
    stored = kube.put(kinds.GPU_DEVICE, body)
    if "status" in body:  # the API takes status through its subresource only
        stored = kube.change(kinds.GPU_DEVICE, {**stored, "status": body["status"]}, status=True)
    view.apply(kinds.GPU_DEVICE, stored)
    return stored


def _api(kube: MemKube, name: str) -> Body | None:
    return kube.stored(kinds.GPU_DEVICE, name, NS)


# -- §6.2: a VMI gone ---------------------------------------------------------------


def test_a_held_device_attached_to_a_vmi_that_is_gone_is_detached_and_the_view_follows() -> None:
    """§6.2: attached by name and uid to a VMI the view no longer has: attachment cleared, in the API and the view."""
    collector, _, view, kube = _collector()
    _seen(view, kube, _attached("d", "v", "u1"))

    def detached() -> bool:
        api = _api(kube, "d")
        return api is not None and not (api.get("status") or {}).get("attachedTo")

    async def scenario() -> tuple[bool, int]:
        return await run_until(collector.run, detached), await posted(kube, NS, "Released")

    done, released = asyncio.run(scenario())
    assert done and released == 1
    held = view.cluster.devices.get((NS, "d"))
    assert held is not None and held.status.attached_to is None


def test_a_template_device_of_a_vmi_that_is_gone_is_deleted_through_its_finalizer() -> None:
    """§6.2, §6.5: the in-use finalizer is dropped first, then the device is deleted under its uid."""
    collector, _, view, kube = _collector()
    _seen(view, kube, _attached("v-gpu-0", "v", "u1", template=True, finalizer=True))
    assert asyncio.run(run_until(collector.run, lambda: _api(kube, "v-gpu-0") is None))
    assert kube.count("patch") >= 1 and kube.count("delete") >= 1


def test_a_device_attached_to_a_live_vmi_is_left_attached_and_protected() -> None:
    """§6.5: the VMI of the name exists with that uid: the collector only adds the in-use finalizer."""
    collector, _, view, kube = _collector()
    view.apply(kinds.VMI, {"metadata": {"name": "v", "namespace": NS, "uid": "u1", "resourceVersion": "1"}})
    _seen(view, kube, _attached("d", "v", "u1"))

    def protected() -> bool:
        api = _api(kube, "d")
        return api is not None and FINALIZER_IN_USE in api["metadata"].get("finalizers", [])

    assert asyncio.run(run_until(collector.run, protected))
    api = _api(kube, "d")
    assert api is not None and api["status"]["attachedTo"]["uid"] == "u1"


def test_a_template_device_gets_its_owner_and_its_finalizer_in_one_write() -> None:
    """§6.1, §6.5: the owner and the in-use finalizer of a template device of a live VMI are one metadata write,
    not two: each write a GPU VM start makes is one more on the API server that VM starts wait on."""
    collector, _, view, kube = _collector()
    view.apply(kinds.VMI, {"metadata": {"name": "v", "namespace": NS, "uid": "u1", "resourceVersion": "1"}})
    _seen(view, kube, _attached("v-gpu-0", "v", "u1", template=True))

    def owned_and_protected() -> bool:
        api = _api(kube, "v-gpu-0")
        meta = (api or {}).get("metadata") or {}
        return FINALIZER_IN_USE in meta.get("finalizers", []) and bool(meta.get("ownerReferences"))

    assert asyncio.run(run_until(collector.run, owned_and_protected))
    api = _api(kube, "v-gpu-0")
    assert api is not None
    assert [(o["kind"], o["name"], o["uid"]) for o in api["metadata"]["ownerReferences"]] == [
        ("VirtualMachineInstance", "v", "u1")
    ]
    assert kube.count("patch") == 1


def test_a_tenants_annotations_are_not_kept_in_the_view_nor_lost_by_a_metadata_write() -> None:
    """Issue 34 item 2: the view keeps a device's own label and none of the tenant's annotations or other labels,
    which a tenant may make as large as etcd allows; the collector's metadata write is a patch under the device's
    version, so what the view left out stays in the API (a replace from the view's copy would erase it)."""
    collector, _, view, kube = _collector()
    view.apply(kinds.VMI, {"metadata": {"name": "v", "namespace": NS, "uid": "u1", "resourceVersion": "1"}})
    body = _attached("v-gpu-0", "v", "u1", template=True)
    fat = {"note": "x" * 200_000}
    body["metadata"]["annotations"], body["metadata"]["labels"]["team"] = fat, "a"
    _seen(view, kube, body)
    kept = view.cluster.devices.get((NS, "v-gpu-0"))
    assert kept is not None and kept.metadata.annotations == {}
    assert kept.metadata.labels == {LABEL_TEMPLATE_DEVICE: TRUE}

    def protected() -> bool:
        return FINALIZER_IN_USE in ((_api(kube, "v-gpu-0") or {}).get("metadata") or {}).get("finalizers", [])

    assert asyncio.run(run_until(collector.run, protected))
    meta = (_api(kube, "v-gpu-0") or {})["metadata"]
    assert meta["annotations"] == fat and meta["labels"] == {LABEL_TEMPLATE_DEVICE: TRUE, "team": "a"}
    assert meta["ownerReferences"][0]["uid"] == "u1"


# -- the one writer's outcomes -------------------------------------------------------------


def test_a_delete_that_loses_a_race_is_decided_again_on_the_writers_fresh_read_alone() -> None:
    """An admission reattaches the device while the delete is in flight: the delete's precondition fails,
    the writer's one read is what the collector decides on (no read of its own), and the device stays."""
    collector, _, view, kube = _collector()
    stored = _seen(view, kube, _attached("v-gpu-0", "v", "u1", template=True))
    reattached = {**stored, "status": {"attachedTo": {"vmi": "v", "since": now().isoformat()}}}
    kube.before_next("delete", lambda: kube.change(kinds.GPU_DEVICE, reattached, status=True))

    def settled() -> bool:
        held = view.cluster.devices.get((NS, "v-gpu-0"))
        return held is not None and held.status.attached_to is not None and held.status.attached_to.uid is None

    async def scenario() -> tuple[bool, int]:
        return await run_until(collector.run, settled), await posted(kube, NS, "Released")

    done, released = asyncio.run(scenario())
    assert done and released == 0  # nothing was released: the admission's version won
    assert _api(kube, "v-gpu-0") is not None
    assert kube.count("get") == 1 and kube.count("delete") == 1


def test_a_status_write_that_loses_a_race_leaves_the_winner_and_looks_again() -> None:
    """A detach under a stale version is a CONFLICT: the winner's write stands, the next pass decides on it."""
    collector, _, view, kube = _collector()
    stored = _seen(view, kube, _attached("d", "v", "u1"))
    later = {**stored, "status": {**stored["status"], "phase": "Pending"}}
    kube.before_next("replace_status", lambda: kube.change(kinds.GPU_DEVICE, later, status=True))

    def detached_on_the_winner() -> bool:
        api = _api(kube, "d")
        return api is not None and not api["status"].get("attachedTo") and api["status"].get("phase") == "Pending"

    async def scenario() -> tuple[bool, int]:
        return await run_until(collector.run, detached_on_the_winner), await posted(kube, NS, "Released")

    done, released = asyncio.run(scenario())
    assert done and released == 1  # the detach that lost posts nothing; the one that landed, once
    assert kube.count("replace_status") == 2


def test_a_raced_write_is_decided_again_on_the_winners_version_within_the_same_pass() -> None:
    """Issue 35 item 3: the collector's writes go through the one read-decide-write loop (`Writer.update`), so
    a detach that lost is decided again on the winner's version at once, not left for a later pass."""
    collector, _, view, kube = _collector()
    stored = _seen(view, kube, _attached("d", "v", "u1"))
    later = {**stored, "status": {**stored["status"], "phase": "Pending"}}
    kube.before_next("replace_status", lambda: kube.change(kinds.GPU_DEVICE, later, status=True))
    collector.touch_device(NS, "d")
    asyncio.run(collector._drain())  # one pass
    api = _api(kube, "d")
    assert api is not None and not api["status"].get("attachedTo") and api["status"].get("phase") == "Pending"


# -- §4, §6.5: requests and classes -----------------------------------------------------------


def test_an_unanswered_bind_request_is_cleared_after_the_grace_period() -> None:
    """§4: a request with no result older than the grace period goes; the device is otherwise untouched."""
    collector, _, view, kube = _collector()
    body = device()
    request = {"id": "r1", "vmi": "v", "devices": ["d"], "requestedAt": _ago(2 * GRACE)}
    body["status"] = {"bindRequest": request}
    _seen(view, kube, body)

    def cleared() -> bool:
        api = _api(kube, "d")
        return api is not None and not (api.get("status") or {}).get("bindRequest")

    assert asyncio.run(run_until(collector.run, cleared))


def test_a_fresh_bind_request_is_left_alone() -> None:
    """§4: within the grace period, the binder may still answer: nothing is written."""
    collector, _, view, kube = _collector()
    body = device()
    body["status"] = {"bindRequest": {"id": "r1", "vmi": "v", "devices": ["d"], "requestedAt": _ago(1)}}
    _seen(view, kube, body)
    writes = len(kube.calls)
    assert not asyncio.run(run_until(collector.run, lambda: len(kube.calls) > writes, within=SHORT))


def test_a_class_keeps_its_finalizer_until_no_device_names_it() -> None:
    """§6.5: the collector adds the class's finalizer; a deleted class goes only once its last device has."""
    collector, _, view, kube = _collector()
    cls = kube.put(
        kinds.GPU_CLASS,
        {
            "apiVersion": API_VERSION,
            "kind": "GPUClass",
            "metadata": {"name": "a10"},
            "spec": {"mode": "passthrough", "resourceName": "nvidia.com/A10"},
        },
    )
    view.apply(kinds.GPU_CLASS, cls)
    _seen(view, kube, device())

    def protected() -> bool:
        api = kube.stored(kinds.GPU_CLASS, "a10")
        return api is not None and FINALIZER_IN_USE in api["metadata"].get("finalizers", [])

    async def scenario() -> tuple[bool, bool, bool]:
        added = await run_until(collector.run, protected)
        await kube.delete(kinds.GPU_CLASS, "a10")
        deleting = kube.stored(kinds.GPU_CLASS, "a10")
        assert deleting is not None
        view.apply(kinds.GPU_CLASS, deleting)
        early = await run_until(collector.run, lambda: kube.stored(kinds.GPU_CLASS, "a10") is None, within=SHORT)
        view.forget(kinds.GPU_DEVICE, NS, "d")
        return added, early, await run_until(collector.run, lambda: kube.stored(kinds.GPU_CLASS, "a10") is None)

    added, early, released = asyncio.run(scenario())
    assert added and not early and released


def test_a_sweep_over_many_devices_hands_the_event_loop_back_as_it_goes() -> None:
    """§14.3: the sweep looks at every device (nothing to do for any here), and other tasks run in between, not only
    once it is over: a 300-device sweep lets a ticker in at least every 64 devices."""
    collector, _, view, kube = _collector()
    for i in range(300):
        _seen(view, kube, device(f"d{i:03}"))

    collector._dirty |= set(view.cluster.devices)
    assert asyncio.run(ticks_during(collector._drain)) >= 300 // 64
