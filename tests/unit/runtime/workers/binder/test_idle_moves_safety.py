"""§5.7 idle moves never hurt the tenant whose device moves, nor spend a unit twice (found in review).

Through the binder, the one writer and the in-memory API: a move whose outcome is unknown frees nothing;
a device that turned idle moments ago (a VM restarting) or that a request being written names (a VM
starting) stays; a device moved once is not moved again for a while, so no tenant can churn another's;
and a younger order that one move would place is not kept waiting behind an older one none can.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable
from typing import Any

from cozygpu.api import kinds
from cozygpu.api.meta import now
from cozygpu.kube.errors import ApiError
from cozygpu.runtime.view import View
from cozygpu.runtime.workers.binder import Binder
from cozygpu.runtime.workers.binder.mover import PLANS
from tests.support.memkube import MemKube
from tests.support.views import A10, EPOCH, device, gpu_class, node, request
from tests.support.workers import SHORT, beside, recorder
from tests.support.workers import until as _until
from tests.support.writing import seen_with_status as _seen
from tests.support.writing import writer

Body = dict[str, Any]


def _attached(vmi: str) -> dict[str, Any]:
    return {"attachedTo": {"vmi": vmi, "uid": f"u-{vmi}", "since": EPOCH.isoformat()}}


def _cloud(
    nodes: dict[str, int], *, idle_after: float = 0.0, clock: Callable[[], float] | None = None
) -> tuple[Binder, View, MemKube]:
    w, view, kube = writer(clock=clock)
    for name, units in nodes.items():
        view.apply(kinds.NODE, node(name, {A10: units}))
    view.apply(kinds.GPU_CLASS, gpu_class("a10"))
    waits: dict[str, Any] = {"idle_after": idle_after} if idle_after else {}  # as before the wait existed
    binder = Binder(view.cluster, w, incomplete_after=30, concurrency=8, idle_moves=4, events=recorder(kube), **waits)
    view.subscribe(binder.changed)
    return binder, view, kube


def _set_status(view: View, kube: MemKube, namespace: str, name: str, status: dict[str, Any]) -> None:
    """Someone else's status write (the webhook's, the collector's), as the API and then the watch see it."""
    stored = kube.stored(kinds.GPU_DEVICE, name, namespace) or {}
    view.apply(kinds.GPU_DEVICE, kube.change(kinds.GPU_DEVICE, {**stored, "status": status}, status=True))


def _status(kube: MemKube, namespace: str, name: str) -> Body:
    return (kube.stored(kinds.GPU_DEVICE, name, namespace) or {}).get("status") or {}


def _where(kube: MemKube, namespace: str, name: str) -> str | None:
    s = _status(kube, namespace, name)
    return s.get("nodeName") if s.get("phase") == "Bound" else None


def _result(kube: MemKube, namespace: str, name: str) -> str | None:
    return (_status(kube, namespace, name).get("bindRequest") or {}).get("result")


def _held(kube: MemKube) -> dict[str, int]:
    held: dict[str, int] = {}
    for d in kube.stored_all(kinds.GPU_DEVICE):
        if (d.get("status") or {}).get("phase") == "Bound":
            held[d["status"]["nodeName"]] = held.get(d["status"]["nodeName"], 0) + d["spec"]["count"]
    return held


def _running(binder: Binder, scenario: Any) -> Any:
    """Run `scenario()` with the binder's loop running beside it, in one event loop."""
    return beside(binder.run, scenario)


def test_a_move_whose_outcome_is_unknown_frees_nothing_on_the_node_it_was_leaving() -> None:
    """§13.1: the move's write fails and so does the fresh read; the view cannot tell where the device is, so
    its old node's units stay taken and no other order is placed there: no node ends over its units."""
    binder, view, kube = _cloud({"X": 8, "Y": 8})
    _seen(view, kube, device("c1", count=2, namespace="c", phase="Bound", node_name="X", status=_attached("v1")))
    _seen(view, kube, device("c2", count=6, namespace="c", phase="Bound", node_name="Y", status=_attached("v2")))
    _seen(view, kube, device("b", count=2, namespace="b", phase="Bound", node_name="X"))  # idle; X 4 free, Y 2
    _seen(view, kube, device("big", count=6, phase="Pending", status=request("r1", "v1", ["big"], now())))
    later = now() + dt.timedelta(seconds=1)
    _seen(
        view, kube, device("mid", count=5, namespace="t2", phase="Pending", status=request("r2", "v2", ["mid"], later))
    )
    kube.fail_next(ApiError(500, "InternalError", "etcd timeout"), method="replace_status")
    kube.fail_next(ApiError(503, "ServiceUnavailable", "restarting"), method="get")

    async def scenario() -> None:
        await _until(lambda: _result(kube, "t2", "mid") is not None and _result(kube, "t1", "big") is not None)
        await asyncio.sleep(SHORT)

    _running(binder, scenario)
    assert all(units <= 8 for units in _held(kube).values()), _held(kube)


def test_a_held_device_detached_for_a_restart_is_not_moved_and_the_restart_keeps_its_node() -> None:
    """§5.7, §6.6: a restart detaches the VM's held device for moments; idle so briefly it stays for its VM, whose
    new VMI gets the same node, while another tenant's order keeps waiting."""
    binder, view, kube = _cloud({"n1": 8, "n2": 8}, idle_after=60)
    _seen(view, kube, device("h", count=2, namespace="vm", phase="Bound", node_name="n1", status=_attached("v")))
    _seen(
        view,
        kube,
        device("v-gpu-1", count=2, namespace="vm", phase="Bound", node_name="n1", template=True, status=_attached("v")),
    )
    _seen(view, kube, device("f1", count=2, namespace="x", phase="Bound", node_name="n1", status=_attached("w1")))
    _seen(view, kube, device("f2", count=6, namespace="x", phase="Bound", node_name="n2", status=_attached("w2")))
    _seen(view, kube, device("big", count=4, created=10))

    async def scenario() -> str | None:
        _set_status(view, kube, "vm", "h", {"phase": "Bound", "nodeName": "n1"})  # the old guest gone: detached
        assert not await _until(lambda: _where(kube, "t1", "big") is not None, SHORT)
        asked = request("r2", "v", ["h", "v-gpu-1"], now())  # the new VMI's admission
        for name in ("h", "v-gpu-1"):
            _set_status(view, kube, "vm", name, {**_status(kube, "vm", name), **asked})
        await _until(lambda: _result(kube, "vm", "h") is not None)
        return _result(kube, "vm", "h")

    assert _running(binder, scenario) == "Succeeded"
    assert _where(kube, "vm", "h") == "n1" and binder.mover.moved == 0


def test_a_device_a_request_being_written_names_is_not_moved_for_someone_else() -> None:
    """§4, §5.7: a VM start writes its request device by device; one not carrying it yet is still that VM's."""
    binder, view, kube = _cloud({"X": 8, "Y": 8})
    _seen(view, kube, device("c1", count=2, namespace="c", phase="Bound", node_name="X", status=_attached("v1")))
    _seen(view, kube, device("c2", count=6, namespace="c", phase="Bound", node_name="Y", status=_attached("v2")))
    _seen(view, kube, device("h1", count=2, namespace="vm", phase="Bound", node_name="X"))
    _seen(view, kube, device("h2", count=2, namespace="vm", phase="Bound", node_name="X"))
    asked = request("r", "v", ["h1", "h2"], now())

    async def scenario() -> str | None:
        _set_status(view, kube, "vm", "h1", {**_status(kube, "vm", "h1"), **asked})  # the webhook's first write
        _seen(view, kube, device("big", count=4, created=10))  # another tenant's order, meanwhile
        await _until(lambda: _where(kube, "t1", "big") is not None, SHORT)
        _set_status(view, kube, "vm", "h2", {**_status(kube, "vm", "h2"), **asked})  # and its second
        await _until(lambda: _result(kube, "vm", "h1") is not None)
        return _result(kube, "vm", "h1")

    assert _running(binder, scenario) == "Succeeded"
    assert _where(kube, "vm", "h2") == "X"


def test_a_tenant_cannot_churn_another_tenants_idle_device_back_and_forth() -> None:
    """§14, §5.7: a device moved is idle anew, so another order that would move it straight back waits; before
    the fix it went X to Y and back for each pair of orders, without end."""
    t = [1000.0]
    binder, view, kube = _cloud({"X": 8, "Y": 8}, idle_after=60, clock=lambda: t[0])
    _seen(view, kube, device("b", count=2, namespace="b", phase="Bound", node_name="X"))
    _seen(view, kube, device("c", count=4, namespace="c", phase="Bound", node_name="Y", status=_attached("vc")))
    t[0] += 100  # b has been idle a while

    async def scenario() -> tuple[str | None, str | None, str | None]:
        _seen(view, kube, device("eight", count=8, namespace="a", created=10))  # fits once b leaves X
        await _until(lambda: _where(kube, "a", "eight") is not None)
        first = _where(kube, "b", "b")
        view.apply(kinds.GPU_DEVICE, kube.remove(kinds.GPU_DEVICE, "eight", "a"), deleted=True)
        _seen(view, kube, device("six", count=6, namespace="a", created=11))  # on X: 2 left there
        await _until(lambda: _where(kube, "a", "six") is not None)
        _seen(view, kube, device("four", count=4, namespace="a", created=12))  # fits on Y once b goes back
        await _until(lambda: _where(kube, "a", "four") is not None, SHORT)
        return first, _where(kube, "b", "b"), _where(kube, "a", "four")

    first, then, four = _running(binder, scenario)
    assert (first, then, four) == ("Y", "Y", None) and binder.mover.moved == 1


def test_a_device_idle_long_enough_is_moved_when_it_has_been_with_no_other_event() -> None:
    """§5.7: the binder wakes by itself when a device that turned idle has been idle the wait: the order that
    needed it is placed then, though nothing else happened meanwhile."""
    binder, view, kube = _cloud({"X": 8, "Y": 8}, idle_after=0.2)
    _seen(view, kube, device("b", count=2, namespace="b", phase="Bound", node_name="X", status=_attached("vb")))
    _seen(view, kube, device("c", count=4, namespace="c", phase="Bound", node_name="Y", status=_attached("vc")))
    _seen(view, kube, device("eight", count=8, namespace="a", created=10))

    async def scenario() -> bool:
        await _until(lambda: _status(kube, "a", "eight").get("phase") == "Pending")
        _set_status(view, kube, "b", "b", {"phase": "Bound", "nodeName": "X"})  # b's VM stops
        return await _until(lambda: _where(kube, "a", "eight") == "X", 3.0)

    assert _running(binder, scenario)
    assert _where(kube, "b", "b") == "Y"


def _full_but_for_q() -> tuple[Binder, View, MemKube]:
    """Two 8-unit nodes: n1 holds p (4) and q (2), n2 holds r (6), all attached; q's VM is about to stop."""
    binder, view, kube = _cloud({"n1": 8, "n2": 8})
    _seen(view, kube, device("p", count=4, namespace="x", phase="Bound", node_name="n1", status=_attached("vp")))
    _seen(view, kube, device("q", count=2, namespace="x", phase="Bound", node_name="n1", status=_attached("vq")))
    _seen(view, kube, device("r", count=6, namespace="x", phase="Bound", node_name="n2", status=_attached("vr")))
    return binder, view, kube


async def _mid_placed_once_q_stops(view: View, kube: MemKube) -> bool:
    """`mid` (4 units, tenant t2) waits while q is attached, and is placed once q's VM stops (one move)."""
    assert not await _until(lambda: _where(kube, "t2", "mid") is not None, SHORT)
    _set_status(view, kube, "x", "q", {"phase": "Bound", "nodeName": "n1"})  # q's VM stops
    return await _until(lambda: _where(kube, "t2", "mid") is not None)


def test_a_younger_order_one_move_would_place_is_not_kept_waiting_behind_an_older_one_none_can() -> None:
    """§5.5, §5.7: when a device turns idle, the first few waiting of its class are decided again, not only the
    oldest: an 8-unit order no move can place does not keep a 4-unit one waiting that one move places."""
    binder, view, kube = _full_but_for_q()
    _seen(view, kube, device("big", count=8, created=10))
    _seen(view, kube, device("mid", count=4, namespace="t2", created=20))

    assert _running(binder, lambda: _mid_placed_once_q_stops(view, kube))
    assert _where(kube, "t1", "big") is None and all(units <= 8 for units in _held(kube).values())


def test_other_tenants_are_answered_while_a_move_is_being_written() -> None:
    """§14.3: the binder does not wait for an idle move's write: another tenant's request that fits as it is is
    answered meanwhile, and the order the move was for is placed once it lands. Before, every decision waited."""
    binder, view, kube = _cloud({"X": 8, "Y": 8, "Z": 2})
    _seen(view, kube, device("b", count=2, namespace="b", phase="Bound", node_name="X"))
    _seen(view, kube, device("c", count=4, namespace="c", phase="Bound", node_name="Y", status=_attached("vc")))

    async def scenario() -> tuple[bool, bool, str | None]:
        slow = kube.hold_status_write("b")
        _seen(view, kube, device("eight", count=8, namespace="a", created=10))  # fits once b leaves X
        moving = await _until(lambda: view.cluster.devices.assumed("b", "b"))
        _seen(
            view,
            kube,
            device("small", count=2, namespace="t3", phase="Pending", status=request("r3", "v3", ["small"], now())),
        )
        answered = await _until(lambda: _result(kube, "t3", "small") is not None)
        slow.set()
        placed = await _until(lambda: _where(kube, "a", "eight") is not None)
        return moving, answered and placed, _where(kube, "b", "b")

    moving, both, b_on = _running(binder, scenario)
    assert moving and both and b_on != "X" and all(units <= 8 for units in _held(kube).values())


def test_a_steady_stream_of_other_events_does_not_put_off_a_device_ripening() -> None:
    """§5.7: while other tenants' VMs stop and start every 0.3 s, an order waiting for a device to have been idle
    the wait is still decided about then. Before, each event pushed the wake later, and it never came."""
    binder, view, kube = _cloud({"X": 8, "Y": 8, "Z": 8}, idle_after=1.0)
    _seen(view, kube, device("b", count=2, namespace="b", phase="Bound", node_name="X", status=_attached("vb")))
    _seen(view, kube, device("c", count=4, namespace="c", phase="Bound", node_name="Y", status=_attached("vc")))
    _seen(view, kube, device("z", count=8, namespace="z", phase="Bound", node_name="Z", status=_attached("vz")))
    _seen(view, kube, device("eight", count=8, namespace="a", created=10))

    async def scenario() -> bool:
        await _until(lambda: _status(kube, "a", "eight").get("phase") == "Pending")
        _set_status(view, kube, "b", "b", {"phase": "Bound", "nodeName": "X"})  # b's VM stops
        for flip in range(20):  # 6 s of another tenant's VM stopping and starting
            running = {"phase": "Bound", "nodeName": "Z", **(_attached("vz") if flip % 2 else {})}
            _set_status(view, kube, "z", "z", running)
            if await _until(lambda: _where(kube, "a", "eight") is not None, 0.3):
                return True
        return False

    assert _running(binder, scenario)


def test_older_orders_no_move_can_place_do_not_keep_a_younger_smaller_one_waiting() -> None:
    """§5.5, §5.7: four older 8-unit orders no move can place; a younger 4-unit one that one move places is
    decided again when a device turns idle (the oldest of each size is). Before, only the four oldest were."""
    binder, view, kube = _full_but_for_q()
    for i in range(4):
        _seen(view, kube, device(f"big{i}", count=8, created=10 + i))
    _seen(view, kube, device("mid", count=4, namespace="t2", created=20))

    assert _running(binder, lambda: _mid_placed_once_q_stops(view, kube))


def test_a_backlog_of_orders_needing_moves_writes_a_bounded_number_of_moves_at_once() -> None:
    """§14.3: twenty 8-unit orders each needing a move, status writes slow: at most PLANS plans' moves and the
    binder's own slots are written at once, whatever the backlog (before: one plan per order, all at once)."""
    nodes = {f"n{k:02d}": 8 for k in range(20)}
    binder, view, kube = _cloud(nodes)
    for k in range(20):
        _seen(view, kube, device(f"i{k}", count=2, namespace=f"o{k}", phase="Bound", node_name=f"n{k:02d}"))
        _seen(view, kube, device(f"big{k}", count=8, namespace="a", created=10 + k))
    out, most = [0], [0]
    plain = kube.replace_status

    async def slow(kind: Any, body: Body) -> Body:
        out[0] += 1
        most[0] = max(most[0], out[0])
        try:
            await asyncio.sleep(0.1)
            return await plain(kind, body)
        finally:
            out[0] -= 1

    kube.replace_status = slow  # type: ignore[method-assign]

    async def scenario() -> None:
        await _until(lambda: sum(_where(kube, "a", f"big{k}") is not None for k in range(20)) >= 3, 3.0)

    _running(binder, scenario)
    assert sum(_where(kube, "a", f"big{k}") is not None for k in range(20)) >= 3
    assert most[0] <= PLANS * 4 + 4, most[0]  # PLANS plans of at most 4 moves, and the binder's 4 slots
    assert all(units <= 8 for units in _held(kube).values())


def test_a_step_that_fails_with_a_device_ripe_still_waits_before_the_next() -> None:
    """A pass that raises before the waiting room still takes the ripe classes, so the binder backs off half a
    second as after any failure; before, the ripe entry stayed due and the loop waited 0 s between passes."""
    binder, view, kube = _cloud({"X": 8}, idle_after=0.05)
    binder.mover.ripe()  # the first pass's reading of the idle clock
    _seen(view, kube, device("b", count=2, namespace="b", phase="Bound", node_name="X"))  # turned idle: ripe soon
    waits: list[float | None] = []
    sooner = binder.mover.sooner

    def recorded(timeout: float | None) -> float | None:
        waits.append(sooner(timeout))
        return waits[-1]

    async def broken() -> bool:
        raise RuntimeError("a bug in answering requests")

    binder._answer_requests = broken  # type: ignore[method-assign]
    binder.mover.sooner = recorded  # type: ignore[method-assign]

    async def scenario() -> None:
        await asyncio.sleep(1.0)

    _running(binder, scenario)
    # One pass may follow at once, for b ripening while a failure was logged; then the back-off after any failure.
    assert len(waits) >= 2 and sum(w == 0 for w in waits) <= 1 and waits[-1] == 0.5, waits


def test_the_binder_stops_when_cancelled_at_the_moment_it_is_woken() -> None:
    """§10: a replica that lost the Lease stops writing at once: a cancel that arrives as the binder is woken ends
    it. Before, asyncio.wait_for on Python 3.11 swallowed such a cancel, and the loop ran on (a test hung)."""
    binder, _, _ = _cloud({"X": 8}, idle_after=60)

    async def scenario() -> bool:
        task = asyncio.create_task(binder.run())
        binder.mover.heard(frozenset({"a10"}))  # a wake due in a minute: the binder waits with a timeout
        await asyncio.sleep(0.2)
        binder.poke()
        task.cancel()
        await asyncio.wait([task], timeout=2)
        stopped = task.done()
        task.cancel()
        return stopped

    assert asyncio.run(scenario())
