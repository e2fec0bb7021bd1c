"""§5.7 idle moves, the planner (decisions.idlemoves) and the view's reach index: which idle held devices move
where so that a set no node can take fits on one, and never anything else."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cozygpu.api import IdleMoves, kinds
from cozygpu.decisions import transitions
from cozygpu.decisions.idlemoves import RoomPlan, movable, plan_room
from cozygpu.decisions.placement import NoPlacement, Placement, place
from cozygpu.runtime.view import View
from cozygpu.state.cluster import Cluster
from tests.support.views import A10, EPOCH, cluster, device, gpu_class, node, request
from tests.support.writing import writer

ATTACHED = {"attachedTo": {"vmi": "vm", "uid": "u1", "since": EPOCH.isoformat()}}


def _idle(name: str, count: int, on: str, **kw: Any) -> dict[str, Any]:
    return device(name, count=count, phase="Bound", node_name=on, **kw)


def _three_nodes_six_free_each(**class_spec: Any) -> Cluster:
    """The issue's cloud: three 8-GPU nodes, each with 6 free and 2 held by an idle device (a stopped VM's)."""
    return cluster(
        nodes=[node(f"n{i}", {A10: 8}) for i in (1, 2, 3)],
        classes=[gpu_class("a10", **class_spec)],
        devices=[_idle(f"idle{i}", 2, f"n{i}", namespace="other") for i in (1, 2, 3)],
    )


def _order(c: Cluster, count: int = 8, name: str = "big") -> list[Any]:
    View(c).apply(kinds.GPU_DEVICE, device(name, count=count, created=10))
    got = c.devices.get(("t1", name))
    assert got is not None
    return [got]


def test_an_eight_gpu_order_fits_once_one_idle_reservation_moves_off_its_node() -> None:
    """Three nodes of 6 free and 2 idle: one move frees a whole node, and the idle device goes where it fits."""
    c = _three_nodes_six_free_each()
    order = _order(c)
    outcome = place(c, order)
    assert isinstance(outcome, NoPlacement) and outcome.full
    plan = plan_room(c, order, limit=4)
    assert plan is not None and len(plan.moves) == 1
    (move,) = plan.moves
    assert move.origin == plan.node and move.to != plan.node and move.device.name == f"idle{plan.node[1]}"


def test_attached_template_requested_or_deleting_devices_never_move() -> None:
    """An idle device is a reservation no one uses: attached, template, in an open request or deleting, it stays."""
    others: list[dict[str, Any]] = [
        _idle("attached1", 2, "n1", status=ATTACHED),
        _idle("template2", 2, "n2", template=True),
        _idle("asked3", 2, "n3", status=request("r", "vm3", ["asked3"], EPOCH)),
    ]
    c = cluster(nodes=[node(f"n{i}", {A10: 8}) for i in (1, 2, 3)], classes=[gpu_class("a10")], devices=others)
    assert plan_room(c, _order(c), limit=4) is None
    assert not any(movable(c, d) for d in c.devices.values() if d.name != "big")


def test_a_device_being_deleted_never_moves() -> None:
    """A device on its way out holds its units until it is gone; nothing is written on it for someone else."""
    doomed = _idle("doomed", 2, "n1")
    doomed["metadata"]["deletionTimestamp"] = EPOCH.isoformat()
    doomed["metadata"]["finalizers"] = ["x"]
    c = cluster(
        nodes=[node("n1", {A10: 8}), node("n2", {A10: 8})],
        classes=[gpu_class("a10")],
        devices=[doomed, _idle("busy", 2, "n2", status=ATTACHED)],
    )
    assert plan_room(c, _order(c), limit=4) is None


def test_a_class_with_idle_moves_never_keeps_its_devices_where_they_are() -> None:
    """GPUClass.spec.idleMoves: Never: its idle devices stay, so the order finds no plan."""
    c = _three_nodes_six_free_each(idleMoves="Never")
    assert plan_room(c, _order(c), limit=4) is None
    assert list(c.capacity.reach_fit(A10, 7)) == []  # nor do they count as reach in the view


def test_the_limit_bounds_the_moves_of_one_decision() -> None:
    """Making room takes two moves on every node: a limit of one finds no plan, a limit of two does."""
    c = cluster(
        nodes=[node(f"n{i}", {A10: 8}) for i in (1, 2, 3)],
        classes=[gpu_class("a10")],
        devices=[_idle(f"i{i}{j}", 1, f"n{i}") for i in (1, 2, 3) for j in (1, 2)],
    )
    order = _order(c)
    assert plan_room(c, order, limit=1) is None
    plan = plan_room(c, order, limit=2)
    assert plan is not None and len(plan.moves) == 2


def test_the_fewest_moves_win_then_the_fullest_node() -> None:
    """One big idle device beats two small ones: the plan moves the 4-unit device, not the pair of 2."""
    c = cluster(
        nodes=[node("n1", {A10: 8}), node("n2", {A10: 8}), node("n3", {A10: 8})],
        classes=[gpu_class("a10")],
        devices=[_idle("four", 4, "n1"), _idle("twoA", 2, "n2"), _idle("twoB", 2, "n2")],
    )
    plan = plan_room(c, _order(c), limit=4)
    assert plan is not None and plan.node == "n1" and [m.device.name for m in plan.moves] == ["four"]


def test_two_moves_into_one_node_never_fill_it_past_its_units() -> None:
    """The plan counts its own earlier moves: a node with 2 free takes one 2-unit device, not two."""
    c = cluster(
        nodes=[node("n1", {A10: 4}), node("n2", {A10: 2}), node("n3", {A10: 2})],
        classes=[gpu_class("a10")],
        devices=[_idle("a", 2, "n1"), _idle("b", 2, "n1")],
    )
    plan = plan_room(c, _order(c, 4), limit=4)
    assert plan is not None and plan.node == "n1"
    assert sorted(m.to for m in plan.moves) == ["n2", "n3"]


def test_a_device_that_turns_idle_raises_reach_for_the_classes_its_node_serves() -> None:
    """The view's hint (§5.7): detaching a held device is news for the class's oldest waiting order."""
    c = cluster(
        nodes=[node("n1", {A10: 8})], classes=[gpu_class("a10")], devices=[_idle("held", 2, "n1", status=ATTACHED)]
    )
    assert list(c.capacity.reach_fit(A10, 7)) == []
    change = View(c).apply(kinds.GPU_DEVICE, _idle("held", 2, "n1"))
    assert change.reach == {"a10"} and list(c.capacity.reach_fit(A10, 8)) == ["n1"]


# -- the property: under random clouds, a plan never moves what it must not and never overfills a node ----------


@st.composite
def _clouds(draw: st.DrawFn) -> tuple[Cluster, list[Any], int]:
    """Nodes of 2, 4 or 8 units filled to within `slack` with devices of every kind and of two classes, one of
    which may say Never; an order of up to a node's size; a limit of 0 to 4 moves."""
    sizes = draw(st.lists(st.sampled_from([2, 4, 8]), min_size=2, max_size=6))
    never = draw(st.booleans())
    classes = [gpu_class("a10"), gpu_class("a10-local", idleMoves="Never" if never else "Allowed")]
    bodies: list[dict[str, Any]] = []
    for at, size in enumerate(sizes):
        used, slack = 0, draw(st.integers(0, size // 2))
        while used < size - slack:
            count = draw(st.integers(1, min(4, size - used)))
            used += count
            i = len(bodies)
            kind = draw(st.sampled_from(["idle", "idle", "idle", "attached", "template", "requested"]))
            status = {
                "idle": {},
                "attached": ATTACHED,
                "template": {},
                "requested": request(f"r{i}", f"vm{i}", [f"d{i}"], EPOCH),
            }[kind]
            cls = draw(st.sampled_from(["a10", "a10", "a10-local"]))
            bodies.append(_idle(f"d{i}", count, f"n{at}", class_name=cls, template=kind == "template", status=status))
    c = cluster(nodes=[node(f"n{i}", {A10: s}) for i, s in enumerate(sizes)], classes=classes, devices=bodies)
    return c, _order(c, draw(st.integers(1, max(sizes)))), draw(st.integers(0, 4))


def _held_after(c: Cluster, plan: RoomPlan) -> dict[str, int]:
    held: dict[str, int] = defaultdict(int)
    moved = {(m.device.namespace, m.device.name): m.to for m in plan.moves}
    for d in c.devices.values():
        if d.holds_gpus and d.status.node_name:
            held[moved.get((d.namespace, d.name), d.status.node_name)] += d.spec.count
    return held


@settings(max_examples=300, deadline=None)
@given(_clouds())
def test_a_plan_moves_only_idle_devices_of_classes_that_allow_it_and_overfills_no_node(
    cloud: tuple[Cluster, list[Any], int],
) -> None:
    """Whatever the cloud: a plan moves at most `limit` devices, each idle and of a class that allows it, each off
    the plan's node to another; afterwards no node holds more than it has and the order fits on the plan's node."""
    c, order, limit = cloud
    if isinstance(place(c, order), Placement):
        return  # it fits as it is: idle moves are not asked
    plan = plan_room(c, order, limit)
    if plan is None:
        return
    assert 1 <= len(plan.moves) <= limit
    for move in plan.moves:
        d = move.device
        assert d.idle and not d.is_template and d.status.attached_to is None and d.open_request is None
        assert c.classes[d.spec.class_name].spec.idle_moves is IdleMoves.ALLOWED  # never a class that says Never
        assert move.origin == plan.node != move.to
    held = _held_after(c, plan)
    for name, info in c.capacity.nodes.items():
        assert held[name] <= info.allocatable[A10], f"node {name} overfilled"
    assert held[plan.node] + order[0].spec.count <= c.capacity.nodes[plan.node].allocatable[A10]


def test_a_set_with_a_member_bound_on_a_node_is_planned_there_too() -> None:
    """A VM start whose held device is Bound on X needs less on X: one move off X makes room there, and the
    planner looks at X although X's reach is below the set's whole size."""
    asked = request("r", "v", ["s", "v-gpu-1"], EPOCH)
    c = cluster(
        nodes=[node("X", {A10: 8}), node("Y", {A10: 8})],
        classes=[gpu_class("a10")],
        devices=[
            _idle("s", 2, "X", status=asked),
            device("v-gpu-1", count=2, template=True, status=asked),
            _idle("o", 2, "X", namespace="other"),
            _idle("a", 4, "X", namespace="other", status=ATTACHED),
            _idle("y", 6, "Y", namespace="other", status=ATTACHED),
        ],
    )
    mine = [c.devices.get(("t1", "s")), c.devices.get(("t1", "v-gpu-1"))]
    assert all(d is not None for d in mine)
    plan = plan_room(c, [d for d in mine if d is not None], limit=4)
    assert plan is not None and plan.node == "X" and [(m.device.name, m.to) for m in plan.moves] == [("o", "Y")]


def test_a_device_an_open_request_names_is_not_movable_before_it_carries_the_request() -> None:
    """§4: the webhook writes a set's request device by device; a device named but not yet written is that VM's."""
    c = cluster(
        nodes=[node("X", {A10: 8})],
        classes=[gpu_class("a10")],
        devices=[
            _idle("h1", 2, "X", status=request("r", "v", ["h1", "h2"], EPOCH)),
            _idle("h2", 2, "X"),
        ],
    )
    h2 = c.devices.get(("t1", "h2"))
    assert h2 is not None and h2.idle and not movable(c, h2)


def test_a_device_moves_only_once_idle_long_enough_and_is_idle_anew_where_it_lands() -> None:
    """§5.7: idle for less than the wait it stays; a move starts its wait again on the new node."""
    t = [0.0]
    c = Cluster(clock=lambda: t[0])
    view = View(c)
    for body in (node("X", {A10: 8}), node("Y", {A10: 8})):
        view.apply(kinds.NODE, body)
    view.apply(kinds.GPU_CLASS, gpu_class("a10"))
    view.apply(kinds.GPU_DEVICE, _idle("b", 2, "X"))
    b = c.devices.get(("t1", "b"))
    assert b is not None
    t[0] = 59.0
    assert not movable(c, b, idle_after=60)
    t[0] = 61.0
    assert movable(c, b, idle_after=60)
    view.apply(kinds.GPU_DEVICE, _idle("b", 2, "Y"))  # moved
    moved = c.devices.get(("t1", "b"))
    assert moved is not None and not movable(c, moved, idle_after=60) and movable(c, moved)


def test_only_more_reach_is_news_not_a_device_recounted_where_it_was() -> None:
    """§14.3: a label on an attached device (uncounted, counted again) raises no reach; its VM stopping does."""
    c = cluster(
        nodes=[node("X", {A10: 8})], classes=[gpu_class("a10")], devices=[_idle("held", 2, "X", status=ATTACHED)]
    )
    labelled = _idle("held", 2, "X", status=ATTACHED)
    labelled["metadata"]["labels"] = {"team": "x"}
    assert View(c).apply(kinds.GPU_DEVICE, labelled).reach == frozenset()
    assert View(c).apply(kinds.GPU_DEVICE, _idle("held", 2, "X")).reach == {"a10"}


def test_a_settled_move_names_the_node_it_left_so_its_status_is_written_again() -> None:
    """§1.3: the change that settles a move names both nodes, so the accountant writes the old node's GPUNode
    (its units now free) too; before, only the new node was named and the old one's status went stale."""
    w, view, kube = writer()
    for name in ("A", "B"):
        view.apply(kinds.NODE, node(name, {A10: 8}))
    view.apply(kinds.GPU_CLASS, gpu_class("a10"))
    body = _idle("x", 2, "A")
    status = body.pop("status")
    body["metadata"].pop("resourceVersion")
    stored = kube.put(kinds.GPU_DEVICE, body)
    view.apply(kinds.GPU_DEVICE, kube.change(kinds.GPU_DEVICE, {**stored, "status": status}, status=True))
    heard: list[Any] = []
    view.subscribe(heard.append)
    x = view.cluster.devices.get(("t1", "x"))
    assert x is not None
    moved = transitions.bound(x, "B", EPOCH)
    token = w.assume(moved).token
    assert view.cluster.capacity.taken_units("A") == {A10: 2}  # kept on the node it leaves until written
    asyncio.run(w.replace_status(kinds.GPU_DEVICE, moved.wire(), assumption=token))
    assert view.cluster.capacity.taken_units("A") == {} and {"A", "B"} <= set().union(*(c.nodes for c in heard))
