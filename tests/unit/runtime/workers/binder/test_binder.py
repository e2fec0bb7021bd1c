"""The binder (§4, §5) driven through the view and the one writer, against the in-memory API.

Nodes and classes reach the view as a watch would; devices are put in the API and the view.
Each test runs the binder's loop until the API shows what the spec says, then checks the API
and the view agree, and that no unit was spent twice (issue 20 item 7).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from cozygpu.api import kinds
from cozygpu.api.meta import now
from cozygpu.runtime.view import View
from cozygpu.runtime.workers.binder import Binder
from tests.support.memkube import MemKube
from tests.support.views import A10, device, gpu_class, node, request
from tests.support.workers import WAIT, run_until
from tests.support.writing import NS, writer
from tests.support.writing import seen_with_status as _seen

Body = dict[str, Any]


def _binder(nodes: dict[str, int]) -> tuple[Binder, View, MemKube]:
    w, view, kube = writer()
    for name, units in nodes.items():
        view.apply(kinds.NODE, node(name, {A10: units}))
    view.apply(kinds.GPU_CLASS, gpu_class("a10"))
    binder = Binder(view.cluster, w, incomplete_after=30, concurrency=8)
    view.subscribe(binder.changed)
    return binder, view, kube


def _status(kube: MemKube, name: str) -> Body:
    return (kube.stored(kinds.GPU_DEVICE, name, NS) or {}).get("status") or {}


def _bound_on(kube: MemKube, name: str) -> str | None:
    status = _status(kube, name)
    return status.get("nodeName") if status.get("phase") == "Bound" else None


def _bound_in_api(kube: MemKube) -> list[str]:
    return sorted(
        d["metadata"]["name"] for d in asyncio.run(kube.list(kinds.GPU_DEVICE)) if d["status"].get("phase") == "Bound"
    )


def test_a_waiting_held_device_is_bound_on_the_best_fit_node_in_the_api_and_the_view() -> None:
    """§5.3: of a node with 4 free units and one with 2, a one-unit device goes where fewest stay free."""
    binder, view, kube = _binder({"n1": 4, "n2": 2})
    _seen(view, kube, device("d"))
    assert asyncio.run(run_until(binder.run, lambda: _bound_on(kube, "d") is not None))
    assert _bound_on(kube, "d") == "n2"
    held = view.cluster.devices.get((NS, "d"))
    assert held is not None and str(held.status.phase) == "Bound" and held.status.node_name == "n2"
    assert not view.cluster.devices.assumed(NS, "d")  # the write settled its assumption


def _answer_a_request_of_two(binder: Binder, view: View, kube: MemKube) -> None:
    """Devices a and b carrying one bind request (§4), run until the binder has answered both."""
    status = request("r1", "vm", ["a", "b"], now())
    _seen(view, kube, device("a", status=status))
    _seen(view, kube, device("b", status=status))

    def answered() -> bool:
        return all(_status(kube, n).get("bindRequest", {}).get("result") for n in ("a", "b"))

    assert asyncio.run(run_until(binder.run, answered))


def test_a_bind_request_places_its_devices_on_one_node_and_is_answered_succeeded() -> None:
    """§4: two devices of one request land together on the one node that has room for both."""
    binder, view, kube = _binder({"n1": 1, "n2": 2})
    _answer_a_request_of_two(binder, view, kube)
    for name in ("a", "b"):
        assert _status(kube, name)["bindRequest"]["result"] == "Succeeded"
        assert _bound_on(kube, name) == "n2"


def test_a_bind_request_no_node_fits_is_answered_failed_with_a_reason_on_every_device() -> None:
    """§4: two units asked, no node has two: Failed on every device of the set, with a message naming the nodes."""
    binder, view, kube = _binder({"n1": 1, "n2": 1})
    _answer_a_request_of_two(binder, view, kube)
    for name in ("a", "b"):
        answer = _status(kube, name)["bindRequest"]
        assert answer["result"] == "Failed" and "no node has 2 free units" in answer["message"]
    # Then the set's devices are held devices outside any open request: the waiting room may place them
    # one by one (§5.5), so nothing is said here of their phase.


def test_a_bind_write_that_conflicts_is_decided_again_on_the_fresh_object_and_spends_the_unit_once() -> None:
    """§13.1: someone writes the device first; the binder binds it on its fresh version, the younger one waits."""
    binder, view, kube = _binder({"n1": 1})
    older = _seen(view, kube, device("a", created=0))
    _seen(view, kube, device("b", created=1))
    labelled = {**older, "metadata": {**older["metadata"], "labels": {"team": "x"}}}
    kube.before_next("replace_status", lambda: kube.change(kinds.GPU_DEVICE, labelled))

    def settled() -> bool:
        return _bound_on(kube, "a") == "n1" and _status(kube, "b").get("phase") == "Pending"

    assert asyncio.run(run_until(binder.run, settled))
    assert _bound_in_api(kube) == ["a"]  # the one unit, spent once
    api = kube.stored(kinds.GPU_DEVICE, "a", NS)
    assert api is not None and api["metadata"]["labels"] == {"team": "x"}  # written on their version
    assert kube.count("replace_status") >= 3  # the lost write, its retry, b's Pending
    held = view.cluster.devices.get((NS, "b"))
    assert held is not None and held.status.node_name is None


def test_a_device_deleted_while_its_bind_is_in_flight_is_not_written_and_its_unit_goes_to_the_next() -> None:
    """The device goes from the API before the write lands: nothing recreates it, and the next device binds."""
    binder, view, kube = _binder({"n1": 1})
    _seen(view, kube, device("a", created=0))
    _seen(view, kube, device("b", created=1))

    # Someone else's delete, just before the binder's write; the view has not heard of it yet.
    kube.before_next("replace_status", lambda: kube.remove(kinds.GPU_DEVICE, "a", NS))
    assert asyncio.run(run_until(binder.run, lambda: _bound_on(kube, "b") == "n1"))
    assert kube.stored(kinds.GPU_DEVICE, "a", NS) is None
    assert view.cluster.devices.get((NS, "a")) is None  # the writer's NotFound: the view forgot it
    assert _bound_in_api(kube) == ["b"]


def test_the_binder_wakes_for_units_freed_and_places_a_device_that_was_waiting() -> None:
    """§5.5: no room, the device waits Pending; a Bound device goes, the room hint wakes the binder, it binds."""
    binder, view, kube = _binder({"n1": 1})
    _seen(view, kube, device("x", phase="Bound", node_name="n1"))
    _seen(view, kube, device("w", created=1))
    freed: list[bool] = []

    def free_when_waiting() -> Callable[[], bool]:
        def holds() -> bool:
            if not freed and _status(kube, "w").get("phase") == "Pending":
                gone = kube.remove(kinds.GPU_DEVICE, "x", NS)
                view.apply(kinds.GPU_DEVICE, gone, deleted=True)  # as the watch's DELETED event
                freed.append(True)
            return _bound_on(kube, "w") == "n1"

        return holds

    assert asyncio.run(run_until(binder.run, free_when_waiting(), within=WAIT))
    assert freed and _bound_in_api(kube) == ["w"]
