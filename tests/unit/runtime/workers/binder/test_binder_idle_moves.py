"""§5.7 idle moves carried out by the binder, through the view and the one writer, against the in-memory API.

The cloud of the issue: 8-unit nodes, each with a 2-unit device of another tenant held by a stopped VM
(idle), and an 8-unit order that fits nowhere until one of them moves. Each test checks what the API
shows afterwards: where every device is, that no node holds more units than it has, and what Events say.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cozygpu.api import kinds
from cozygpu.api.meta import now
from cozygpu.runtime.view import View
from cozygpu.runtime.workers.binder import Binder
from tests.support.memkube import MemKube
from tests.support.views import A10, EPOCH, device, gpu_class, node, request
from tests.support.workers import SHORT, recorder, run_until
from tests.support.writing import seen_with_status as _seen
from tests.support.writing import writer

Body = dict[str, Any]
OTHER = "other"  # the tenant whose idle devices move
ATTACHED = {"attachedTo": {"vmi": "vm-other", "uid": "u-other", "since": EPOCH.isoformat()}}


def _cloud(
    nodes: int = 3, *, idle_moves: int = 4, attached: bool = False, **class_spec: Any
) -> tuple[Binder, View, MemKube]:
    """`nodes` nodes of 8 units, each with a 2-unit device of another tenant on it (attached to a VMI or idle)."""
    w, view, kube = writer()
    for i in range(1, nodes + 1):
        view.apply(kinds.NODE, node(f"n{i}", {A10: 8}))
    view.apply(kinds.GPU_CLASS, gpu_class("a10", **class_spec))
    binder = Binder(view.cluster, w, incomplete_after=30, concurrency=8, idle_moves=idle_moves, events=recorder(kube))
    view.subscribe(binder.changed)
    for i in range(1, nodes + 1):
        _seen(
            view,
            kube,
            device(
                f"held{i}",
                count=2,
                namespace=OTHER,
                phase="Bound",
                node_name=f"n{i}",
                status=ATTACHED if attached else None,
            ),
        )
    return binder, view, kube


def _api(kube: MemKube) -> dict[tuple[str, str], Body]:
    return {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in kube.stored_all(kinds.GPU_DEVICE)}


def _phase(kube: MemKube, name: str, namespace: str = "t1") -> str | None:
    return (_api(kube)[(namespace, name)].get("status") or {}).get("phase")


def _where(kube: MemKube, name: str, namespace: str = "t1") -> str | None:
    status = _api(kube)[(namespace, name)].get("status") or {}
    return status.get("nodeName") if status.get("phase") == "Bound" else None


def _never_over(kube: MemKube, capacity: int = 8) -> dict[str, int]:
    """Units Bound per node in the API; none holds more than it has."""
    held: dict[str, int] = defaultdict(int)
    for d in _api(kube).values():
        if (d.get("status") or {}).get("phase") == "Bound":
            held[d["status"]["nodeName"]] += d["spec"]["count"]
    assert all(units <= capacity for units in held.values()), held
    return dict(held)


def _moved(kube: MemKube) -> list[str]:
    """The other tenant's devices no longer on the node they started on (heldN on nN)."""
    return [n for (ns, n), d in _api(kube).items() if ns == OTHER and d["status"].get("nodeName") != f"n{n[-1]}"]


def test_a_waiting_eight_gpu_device_is_bound_once_an_idle_reservation_moves_off_its_node() -> None:
    """§5.7: one idle 2-unit device moves to another node, the 8-unit order takes the node it left, all Bound."""
    binder, view, kube = _cloud()
    _seen(view, kube, device("big", count=8, created=10))
    assert asyncio.run(run_until(binder.run, lambda: _where(kube, "big") is not None))
    home = _where(kube, "big") or ""
    assert _never_over(kube)[home] == 8
    assert _moved(kube) == [f"held{home[-1]}"]  # exactly the one that was on its node
    assert all(d["status"]["phase"] == "Bound" for (ns, _), d in _api(kube).items() if ns == OTHER)
    assert binder.mover.moved == 1


def test_the_moved_devices_tenant_is_told_why_and_never_who_the_room_was_for() -> None:
    """§5.7, §14: a Moved Event on the moved device names its nodes and idleness, not the other tenant's order."""
    binder, view, kube = _cloud()
    _seen(view, kube, device("big-secret-order", count=8, created=10))

    async def placed_and_told() -> list[Body]:
        assert await run_until(binder.run, lambda: _where(kube, "big-secret-order") is not None)
        await asyncio.sleep(0.05)  # the recorder's posters post in the background
        return [e for e in kube.stored_all(kinds.kind("Event"), OTHER) if e["reason"] == "Moved"]

    moved = asyncio.run(placed_and_told())
    assert len(moved) == 1 and "attached to no VMI" in moved[0]["message"]
    assert "big-secret-order" not in moved[0]["message"] and "t1" not in moved[0]["message"]


def test_a_bind_request_for_eight_gpus_is_answered_succeeded_after_an_idle_move() -> None:
    """§4, §5.7: a VMI's request for an 8-unit device fits once an idle device moves; answered Succeeded."""
    binder, view, kube = _cloud()
    _seen(view, kube, device("big", count=8, created=10, status=request("r1", "vm", ["big"], now())))

    def answered() -> bool:
        return bool((_api(kube)[("t1", "big")]["status"].get("bindRequest") or {}).get("result"))

    assert asyncio.run(run_until(binder.run, answered))
    assert _api(kube)[("t1", "big")]["status"]["bindRequest"]["result"] == "Succeeded"
    assert _where(kube, "big") is not None and binder.mover.moved == 1
    _never_over(kube)


def test_with_idle_moves_off_the_order_waits_and_nothing_moves() -> None:
    """`--max-idle-moves 0`: the 8-unit order stays Pending and every idle device stays where it was."""
    binder, view, kube = _cloud(idle_moves=0)
    _seen(view, kube, device("big", count=8, created=10))
    assert not asyncio.run(run_until(binder.run, lambda: _where(kube, "big") is not None, within=SHORT))
    assert _phase(kube, "big") == "Pending" and _moved(kube) == []


def test_a_class_that_forbids_idle_moves_keeps_its_devices_and_the_order_waits() -> None:
    """GPUClass.spec.idleMoves: Never: no device of the class moves for someone else."""
    binder, view, kube = _cloud(idleMoves="Never")
    _seen(view, kube, device("big", count=8, created=10))
    assert not asyncio.run(run_until(binder.run, lambda: _where(kube, "big") is not None, within=SHORT))
    assert binder.mover.moved == 0 and _phase(kube, "big") == "Pending"


def test_attached_devices_never_move_and_the_order_is_placed_once_one_detaches() -> None:
    """§5.7: devices of running VMs stay; when one VM stops its device becomes idle, and the binder, woken by
    the reach that gave, moves it and places the waiting order."""
    binder, view, kube = _cloud(attached=True)
    _seen(view, kube, device("big", count=8, created=10))
    stops: list[str] = []

    def stop_once_waiting() -> bool:
        if not stops and _phase(kube, "big") == "Pending":
            assert binder.mover.moved == 0
            idle = {"phase": "Bound", "nodeName": "n2"}  # its VM stopped: attached to none
            stopped = kube.change(kinds.GPU_DEVICE, {**_api(kube)[(OTHER, "held2")], "status": idle}, status=True)
            view.apply(kinds.GPU_DEVICE, stopped)  # as the watch delivers the VM's stop
            stops.append("held2")
        return _where(kube, "big") is not None

    assert asyncio.run(run_until(binder.run, stop_once_waiting)) and stops
    assert _where(kube, "big") == "n2" and _where(kube, "held2", OTHER) != "n2"
    for name in ("held1", "held3"):
        assert _where(kube, name, OTHER) == f"n{name[-1]}"  # still attached: never moved
    _never_over(kube)


def test_a_move_someone_else_wrote_first_leaves_the_order_undecided_and_spends_nothing_twice() -> None:
    """§5.7, §13.1: the idle device's VM starts (attached) just before the move lands: the move fails, the
    order is not bound on a node that is still full, and it is decided again on the view as the API has it."""
    binder, view, kube = _cloud(nodes=1)
    view.apply(kinds.NODE, node("n2", {A10: 2}))  # where the idle device could go
    _seen(view, kube, device("big", count=8, created=10))
    idle = _api(kube)[(OTHER, "held1")]
    started = {**idle, "status": {**idle["status"], **ATTACHED}}  # its VM starts, attaching it, first
    kube.before_next("replace_status", lambda: kube.change(kinds.GPU_DEVICE, started, status=True))
    assert not asyncio.run(run_until(binder.run, lambda: _where(kube, "big") is not None, within=SHORT))
    assert _where(kube, "held1", OTHER) == "n1"  # attached by its VM: it stayed
    assert _phase(kube, "big") == "Pending"
    _never_over(kube)


def test_a_request_whose_move_lost_a_race_to_a_harmless_write_is_decided_again_and_succeeds() -> None:
    """§5.7, §13.1: a label written on the idle device first makes its move fail; the request is left open, not
    answered Failed on the view of before, and the next pass moves the device again and places the set."""
    binder, view, kube = _cloud(nodes=1)
    view.apply(kinds.NODE, node("n2", {A10: 2}))  # the one plan: held1 to n2
    stored = _api(kube)[(OTHER, "held1")]
    labelled = {**stored, "metadata": {**stored["metadata"], "labels": {"team": "x"}}}
    kube.before_next("replace_status", lambda: kube.change(kinds.GPU_DEVICE, labelled))
    _seen(view, kube, device("big", count=8, created=10, status=request("r1", "vm", ["big"], now())))

    def answered() -> bool:
        return bool((_api(kube)[("t1", "big")]["status"].get("bindRequest") or {}).get("result"))

    assert asyncio.run(run_until(binder.run, answered))
    assert _api(kube)[("t1", "big")]["status"]["bindRequest"]["result"] == "Succeeded"
    assert _where(kube, "held1", OTHER) == "n2" and _api(kube)[(OTHER, "held1")]["metadata"]["labels"] == {"team": "x"}
    _never_over(kube)


# -- the property: under random sequences of orders, starts, stops and deletions, the binder never moves an
# -- attached device and never has a node hold more than it has, at any moment the API is looked at ---------

Op = tuple[str, int]
_ops = st.lists(
    st.tuples(st.sampled_from(["order", "order", "start", "stop", "stop", "delete"]), st.integers(0, 63)),
    min_size=4,
    max_size=24,
)


async def _settled(view: View, kube: MemKube) -> None:
    """Until the API stops changing and the view assumes nothing, checking every look that no node is over."""
    last: object = None
    for _ in range(400):
        _never_over(kube)
        now = sorted((k, d["metadata"]["resourceVersion"]) for k, d in _api(kube).items())
        if now == last and not any(view.cluster.devices.assumed(*k) for k, _ in now):
            return
        last = now
        await asyncio.sleep(0.01)
    raise AssertionError("the binder never settled: moves without end?")


def _apply(view: View, kube: MemKube, op: Op, made: int) -> None:
    """One tenant action, as the API and then the watch would see it."""
    what, i = op
    devices = sorted(_api(kube).items())
    bound = [(k, d) for k, d in devices if (d.get("status") or {}).get("phase") == "Bound"]
    if what == "order":
        _seen(view, kube, device(f"o{made}", count=1 + i % 8 if i % 3 else 8, created=made))
    elif what == "start" and (idle := [(k, d) for k, d in bound if "attachedTo" not in d["status"]]):
        _, d = idle[i % len(idle)]
        started = {**d["status"], "attachedTo": {"vmi": f"vm-{i}", "uid": f"u-{i}", "since": EPOCH.isoformat()}}
        view.apply(kinds.GPU_DEVICE, kube.change(kinds.GPU_DEVICE, {**d, "status": started}, status=True))
    elif what == "stop" and (running := [(k, d) for k, d in bound if "attachedTo" in d["status"]]):
        _, d = running[i % len(running)]
        stopped = {k: v for k, v in d["status"].items() if k != "attachedTo"}
        view.apply(kinds.GPU_DEVICE, kube.change(kinds.GPU_DEVICE, {**d, "status": stopped}, status=True))
    elif what == "delete" and devices:
        (ns, name), _ = devices[i % len(devices)]
        view.apply(kinds.GPU_DEVICE, kube.remove(kinds.GPU_DEVICE, name, ns), deleted=True)


def _day(ops: list[Op]) -> Binder:
    """Run the binder through `ops` on four 8-unit nodes; after each, check no device attached before it moved."""
    binder, view, kube = _cloud(nodes=4)

    async def day() -> None:
        task = asyncio.create_task(binder.run())
        try:
            for made, op in enumerate(ops):
                await _settled(view, kube)
                _apply(view, kube, op, made)
                pinned = {
                    k: d["status"]["nodeName"] for k, d in _api(kube).items() if "attachedTo" in (d.get("status") or {})
                }
                await _settled(view, kube)
                after = _api(kube)
                for k, where in pinned.items():
                    assert k not in after or after[k]["status"]["nodeName"] == where, f"attached {k} moved"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(day())
    return binder


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_ops)
def test_no_attached_device_ever_moves_and_no_node_is_ever_over_allocated(ops: list[Op]) -> None:
    """§5.7, §13.1: whatever tenants do in whatever order, a device attached to a VMI stays on its node while
    attached, every look at the API finds no node over its units, and the binder comes to rest."""
    _day(ops)


def test_a_seeded_day_of_random_actions_makes_idle_moves_under_the_same_checks() -> None:
    """The property is not vacuous: a long seeded sequence of the same actions does move idle devices."""
    rng = random.Random(7)
    ops = [(rng.choice(["order", "order", "start", "stop", "stop", "delete"]), rng.randrange(64)) for _ in range(80)]
    assert _day(ops).mover.moved > 0
