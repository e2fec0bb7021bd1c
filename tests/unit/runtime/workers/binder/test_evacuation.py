"""§6.8, issue 37 item 4: idle held devices leave a cordoned node for nodes that take them, paced, so a node taken out
of service leaves no device Lost; carried out by the binder through the view and the one writer, against the
in-memory API. Each test checks where the API has every device afterwards, and what Events say."""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from cozygpu.api import kinds
from cozygpu.decisions.idlemoves import leaving
from cozygpu.runtime.view import View
from cozygpu.runtime.workers.binder import Binder
from tests.support.memkube import MemKube
from tests.support.views import A10, EPOCH, cluster, device, gpu_class, node
from tests.support.workers import SHORT, recorder, run_until
from tests.support.writing import seen_with_status as _seen
from tests.support.writing import writer

Body = dict[str, Any]
ATTACHED = {"attachedTo": {"vmi": "vm", "uid": "u1", "since": EPOCH.isoformat()}}


def _cloud(
    held: list[tuple[str, int, str]], *, nodes: int = 3, units: int = 8, per_node: int = 2, most: int = 5, **spec: Any
) -> tuple[Binder, View, MemKube]:
    """`nodes` nodes of `units` A10s, and held devices (name, units, node) Bound there, idle unless named `busy*`."""
    w, view, kube = writer()
    for i in range(1, nodes + 1):
        view.apply(kinds.NODE, node(f"n{i}", {A10: units}))
    view.apply(kinds.GPU_CLASS, gpu_class("a10", **spec))
    binder = Binder(
        view.cluster,
        w,
        incomplete_after=30,
        concurrency=8,
        events=recorder(kube),
        evacuations_per_node=per_node,
        evacuations=most,
    )
    view.subscribe(binder.changed)
    for name, count, on in held:
        status = ATTACHED if name.startswith("busy") else None
        _seen(view, kube, device(name, count=count, phase="Bound", node_name=on, status=status))
    return binder, view, kube


def _cordon(view: View, name: str, units: int = 8) -> None:
    view.apply(kinds.NODE, node(name, {A10: units}, unschedulable=True))


def _where(kube: MemKube, name: str) -> str | None:
    status = (kube.stored(kinds.GPU_DEVICE, name, "t1") or {}).get("status") or {}
    return status.get("nodeName") if status.get("phase") == "Bound" else None


def _events(kube: MemKube) -> list[str]:
    return [e.get("message", "") for e in kube.stored_all(kinds.kind("Event")) if e.get("reason") == "Moved"]


def test_an_idle_device_leaves_a_cordoned_node_for_one_that_takes_it_and_says_why() -> None:
    """Node n1 cordoned: its idle held device moves to the fullest other node serving its class, with a `Moved`
    Event that says node maintenance, and the log event platform teams read (docs/operating.md, "Logs")."""
    binder, view, kube = _cloud([("idle", 2, "n1"), ("other", 4, "n3")])
    _cordon(view, "n1")
    with structlog.testing.capture_logs() as logged:
        assert asyncio.run(run_until(binder.run, lambda: _where(kube, "idle") != "n1"))
    assert _where(kube, "idle") == "n3"  # best fit: the fullest node that takes it
    assert any("node maintenance" in m and "cordoned" in m for m in _events(kube)), _events(kube)
    moved = [e for e in logged if e["event"] == "device.moved"]
    assert [(e["device"], e["node"], e["to"], e["reason"]) for e in moved] == [("idle", "n1", "n3", "node maintenance")]


def test_devices_in_use_or_of_a_class_that_never_moves_stay() -> None:
    """A device attached to a VMI is not idle (its VM's evacuation is another matter), and a class with
    idleMoves: Never keeps its devices where they are."""
    binder, view, kube = _cloud([("busy", 2, "n1"), ("idle", 2, "n1")], idleMoves="Never")
    _cordon(view, "n1")
    assert not asyncio.run(run_until(binder.run, lambda: _where(kube, "idle") != "n1", within=SHORT))
    binder, view, kube = _cloud([("busy", 2, "n1")])
    _cordon(view, "n1")
    assert not asyncio.run(run_until(binder.run, lambda: _where(kube, "busy") != "n1", within=SHORT))


def test_a_device_no_other_node_takes_stays_until_room_appears() -> None:
    """Every other node full: the device stays where it is (Bound, not Lost); a node joining with room takes it."""
    binder, view, kube = _cloud([("idle", 4, "n1"), ("full2", 8, "n2")], nodes=2)
    _cordon(view, "n1")

    async def run() -> tuple[str | None, str | None]:
        task = asyncio.create_task(binder.run())
        await asyncio.sleep(SHORT)
        before = _where(kube, "idle")
        view.apply(kinds.NODE, node("n3", {A10: 8}))
        for _ in range(200):
            if _where(kube, "idle") == "n3":
                break
            await asyncio.sleep(0.01)
        task.cancel()
        return before, _where(kube, "idle")

    assert asyncio.run(run()) == ("n1", "n3")


def test_moves_off_a_cordoned_node_are_paced() -> None:
    """Five idle devices on a cordoned node, at most two under way off a node: while the first writes are held,
    only two devices have left; then every one does."""
    held = [(f"idle{i}", 1, "n1") for i in range(5)]
    binder, view, kube = _cloud(held, per_node=2)
    gates = [kube.hold_status_write(f"idle{i}") for i in range(5)]
    _cordon(view, "n1")

    async def run() -> tuple[int, list[str | None]]:
        task = asyncio.create_task(binder.run())
        await asyncio.sleep(SHORT)
        under_way = sum(1 for d in view.cluster.devices.values() if d.status.node_name != "n1")
        for gate in gates:
            gate.set()
        for _ in range(300):
            if all(_where(kube, f"idle{i}") not in (None, "n1") for i in range(5)):
                break
            await asyncio.sleep(0.01)
        task.cancel()
        return under_way, [_where(kube, f"idle{i}") for i in range(5)]

    under_way, where = asyncio.run(run())
    assert under_way == 2, under_way
    assert all(w not in (None, "n1") for w in where), where


def test_leaving_looks_only_at_cordoned_nodes_and_keeps_to_the_room_it_is_given() -> None:
    """The decision: nothing moves off nodes in service; off a cordoned node, at most its room, largest first."""
    c = cluster(
        nodes=[node("n1", {A10: 8}, unschedulable=True), node("n2", {A10: 8}), node("n3", {A10: 8})],
        classes=[gpu_class("a10")],
        devices=[
            device("a", count=1, phase="Bound", node_name="n1"),
            device("b", count=3, phase="Bound", node_name="n1"),
            device("c", count=2, phase="Bound", node_name="n2"),
        ],
    )
    assert [m.device.name for m in leaving(c, 0.0, lambda n: 1, 5)] == ["b"]
    assert sorted(m.device.name for m in leaving(c, 0.0, lambda n: 2, 5)) == ["a", "b"]
    assert leaving(c, 0.0, lambda n: 2, 0) == []
    View(c).apply(kinds.NODE, node("n1", {A10: 8}))  # back in service
    assert leaving(c, 0.0, lambda n: 2, 5) == []
