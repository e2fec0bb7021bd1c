"""§5.7: an order waiting for an idle device is decided again when that device has been idle the wait, however
it turned idle (issue 33 item 1).

Before, the binder only counted the wait from a rise of a node's free plus idle units, which a detach makes;
a device placed by the binder, moved by an idle move, or found idle in the list an operator starts from turns
idle without one (its units go from free to idle), and the order waiting for it was never decided again.
Through the binder, the one writer and the in-memory API, on the real monotonic clock.
"""

from __future__ import annotations

from typing import Any

from cozygpu.api import kinds
from cozygpu.runtime.view import View
from cozygpu.runtime.workers.binder import Binder
from tests.support.memkube import MemKube
from tests.support.views import A10, EPOCH, device, gpu_class, node
from tests.support.workers import beside, recorder
from tests.support.workers import until as _until
from tests.support.writing import seen_with_status as _seen
from tests.support.writing import writer

Body = dict[str, Any]
WAIT = 0.6  # seconds a device is idle before it may move (--idle-move-after, scaled down)


def _binder(view: View, kube: MemKube, w: Any) -> Binder:
    binder = Binder(
        view.cluster, w, incomplete_after=30, concurrency=8, idle_moves=4, idle_after=WAIT, events=recorder(kube)
    )
    view.subscribe(binder.changed)
    return binder


def _status(kube: MemKube, namespace: str, name: str) -> Body:
    return (kube.stored(kinds.GPU_DEVICE, name, namespace) or {}).get("status") or {}


def _where(kube: MemKube, namespace: str, name: str) -> str | None:
    s = _status(kube, namespace, name)
    return s.get("nodeName") if s.get("phase") == "Bound" else None


def _set_status(view: View, kube: MemKube, namespace: str, name: str, status: Body) -> None:
    """Someone else's status write (the webhook's, the collector's), as the API and then the watch see it."""
    stored = kube.stored(kinds.GPU_DEVICE, name, namespace) or {}
    view.apply(kinds.GPU_DEVICE, kube.change(kinds.GPU_DEVICE, {**stored, "status": status}, status=True))


def _attached(vmi: str) -> Body:
    return {"attachedTo": {"vmi": vmi, "uid": f"u-{vmi}", "since": EPOCH.isoformat()}}


def _running(binder: Binder, scenario: Any) -> Any:
    return beside(binder.run, scenario)


def _units(kube: MemKube) -> dict[str, int]:
    held: dict[str, int] = {}
    for d in kube.stored_all(kinds.GPU_DEVICE):
        if (d.get("status") or {}).get("phase") == "Bound":
            held[d["status"]["nodeName"]] = held.get(d["status"]["nodeName"], 0) + d["spec"]["count"]
    return held


def test_a_reservation_the_binder_placed_becomes_movable_and_the_waiting_order_is_placed() -> None:
    """The issue's cloud: two 4-unit nodes; 3+3 then 1+1 placed by the binder, the 3s deleted, one 1 attached; an
    order of 4 waits Pending while the other 1 is young, and is placed once that 1 has been idle the wait."""
    w, view, kube = writer()
    view.apply(kinds.NODE, node("A", {A10: 4}))
    view.apply(kinds.NODE, node("B", {A10: 4}))
    view.apply(kinds.GPU_CLASS, gpu_class("a10"))
    binder = _binder(view, kube, w)

    async def scenario() -> tuple[str | None, bool, str | None]:
        for i, (name, count) in enumerate([("big1", 3), ("big2", 3), ("one1", 1), ("one2", 1)]):
            _seen(view, kube, device(name, count=count, created=i + 1))
            assert await _until(lambda n=name: _where(kube, "t1", n) is not None, 2.0)
        for name in ("big1", "big2"):
            view.apply(kinds.GPU_DEVICE, kube.remove(kinds.GPU_DEVICE, name, "t1"), deleted=True)
        _set_status(view, kube, "t1", "one1", {**_status(kube, "t1", "one1"), **_attached("vm1")})
        _seen(view, kube, device("four", count=4, created=10))
        assert await _until(lambda: _status(kube, "t1", "four").get("phase") == "Pending", 2.0)
        young = view.cluster.capacity.idle_for(("t1", "one2"))
        placed = await _until(lambda: _where(kube, "t1", "four") is not None, WAIT + 3.0)
        return _where(kube, "t1", "one1"), young is not None and young < WAIT and placed, _where(kube, "t1", "four")

    attached_on, waited_then_placed, four_on = _running(binder, scenario)
    assert waited_then_placed
    assert four_on != attached_on and _where(kube, "t1", "one2") == attached_on  # the idle 1 joined the other
    assert all(units <= 4 for units in _units(kube).values())


def test_a_device_an_idle_move_landed_becomes_movable_again_for_the_next_order() -> None:
    """A device moved is idle anew where it lands (no churn), and an order that needs it moved again is placed once
    it has been idle the wait there: the order of 4 that only node Y serves waits, then b moves on to Z."""
    w, view, kube = writer()
    view.apply(kinds.NODE, node("X", {A10: 8}))
    view.apply(kinds.NODE, node("Y", {A10: 8}, labels={"pool": "y"}))
    view.apply(kinds.NODE, node("Z", {A10: 8}))
    view.apply(kinds.GPU_CLASS, gpu_class("a10"))
    view.apply(kinds.GPU_CLASS, gpu_class("y-only", nodeSelector={"pool": "y"}))
    binder = _binder(view, kube, w)
    _seen(view, kube, device("b", count=2, namespace="b", phase="Bound", node_name="X", status=_attached("vb")))
    _seen(view, kube, device("c", count=4, namespace="c", phase="Bound", node_name="Y", status=_attached("vc")))
    _seen(view, kube, device("z", count=2, namespace="z", phase="Bound", node_name="Z", status=_attached("vz")))

    async def scenario() -> tuple[str | None, bool]:
        _seen(view, kube, device("eight", count=8, namespace="a", created=10))
        _set_status(view, kube, "b", "b", {"phase": "Bound", "nodeName": "X"})  # b's VM stops: a detach
        assert await _until(lambda: _where(kube, "a", "eight") == "X", WAIT + 3.0)
        first = _where(kube, "b", "b")  # Y: the fullest node that takes it (4 free against Z's 6)
        _seen(view, kube, device("four", class_name="y-only", count=4, namespace="a", created=11))
        assert await _until(lambda: _status(kube, "a", "four").get("phase") == "Pending", 2.0)
        young = view.cluster.capacity.idle_for(("b", "b"))
        placed = await _until(lambda: _where(kube, "a", "four") == "Y", WAIT + 3.0)
        return first, young is not None and young < WAIT and placed

    first, waited_then_placed = _running(binder, scenario)
    assert first == "Y" and waited_then_placed
    assert _where(kube, "b", "b") == "Z" and binder.mover.moved == 2
    assert all(units <= 8 for units in _units(kube).values())


def test_a_device_found_idle_in_the_list_an_operator_starts_from_becomes_movable() -> None:
    """A restarted operator (or a new leader) counts the idle devices of its first list as idle from then: an order
    that arrives before they have been idle the wait is placed once they have, with no other event."""
    w, view, kube = writer()
    view.apply(kinds.NODE, node("X", {A10: 8}))
    view.apply(kinds.NODE, node("Y", {A10: 8}))
    view.apply(kinds.GPU_CLASS, gpu_class("a10"))
    # The view as the first list leaves it, before the binder hears anything.
    _seen(view, kube, device("b", count=2, namespace="b", phase="Bound", node_name="X"))
    _seen(view, kube, device("c", count=4, namespace="c", phase="Bound", node_name="Y", status=_attached("vc")))
    binder = _binder(view, kube, w)

    async def scenario() -> bool:
        _seen(view, kube, device("eight", count=8, namespace="a", created=10))
        assert await _until(lambda: _status(kube, "a", "eight").get("phase") == "Pending", 2.0)
        young = view.cluster.capacity.idle_for(("b", "b"))
        placed = await _until(lambda: _where(kube, "a", "eight") == "X", WAIT + 3.0)
        return young is not None and young < WAIT and placed

    assert _running(binder, scenario)
    assert _where(kube, "b", "b") == "Y"


def test_a_device_ripening_wakes_only_the_classes_its_node_serves_with_its_resource() -> None:
    """The view hands out, per span of its idle clock, the classes served where devices turned idle then, and
    only while they are idle still: a device attached meanwhile wakes nothing."""
    t = [100.0]
    _, view, kube = writer(clock=lambda: t[0])
    view.apply(kinds.NODE, node("X", {A10: 8}))
    view.apply(kinds.NODE, node("Y", {"nvidia.com/other": 8}))
    view.apply(kinds.GPU_CLASS, gpu_class("a10"))
    view.apply(kinds.GPU_CLASS, gpu_class("other", resource="nvidia.com/other"))
    _seen(view, kube, device("b", count=2, namespace="b", phase="Bound", node_name="X"))
    t[0] = 101.0
    _seen(view, kube, device("o", class_name="other", count=2, namespace="o", phase="Bound", node_name="Y"))
    t[0] = 102.0
    _seen(view, kube, device("d", count=2, namespace="d", phase="Bound", node_name="X"))
    _set_status(view, kube, "d", "d", {"phase": "Bound", "nodeName": "X", **_attached("vd")})
    cluster = view.cluster
    assert cluster.capacity.turned_idle(99.0, 100.0) == {"a10"}
    assert cluster.capacity.turned_idle(100.0, 101.0) == {"other"}
    assert cluster.capacity.turned_idle(101.0, 105.0) == set()  # d is attached now
    assert (
        cluster.capacity.next_idle(99.0) == 100.0
        and cluster.capacity.next_idle(100.0) == 101.0
        and cluster.capacity.next_idle(101.0) is None
    )
