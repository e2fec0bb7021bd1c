"""Decisions counted before their writes return (§13.1): assumed in the view, settled by the API's answer."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cozygpu.api import GPUDevice, kinds
from cozygpu.decisions import transitions
from cozygpu.decisions.placement import Placement, place
from cozygpu.runtime.view import View
from cozygpu.state.cluster import Cluster
from tests.support.views import A10, EPOCH, cluster, device, gpu_class, node


def with_version(body: dict[str, Any], rv: int) -> dict[str, Any]:
    return {**body, "metadata": {**body["metadata"], "resourceVersion": str(rv)}}


def test_an_assumed_decision_outlives_events_of_the_version_it_was_made_on() -> None:
    """A resync's list or a late echo still carrying the old version cannot undo a decision in flight:
    its units stay spent; the API's answer (a newer version) replaces it."""
    c = cluster(nodes=[node("n1", {A10: 1})], classes=[gpu_class("a10")], devices=[with_version(device("a"), 5)])
    pending = c.devices.get(("t1", "a"))
    assert pending is not None
    token = View(c).assume(transitions.bound(pending, "n1", EPOCH)).token
    View(c).apply(kinds.GPU_DEVICE, with_version(device("a"), 5))
    assert c.devices.held_by_class("n1") == {"a10": 1}
    assert c.devices.assumed("t1", "a")
    assert View(c).settle("t1", "a", token)
    View(c).apply(kinds.GPU_DEVICE, with_version(device("a", phase="Bound", node_name="n1"), 6))
    stored = c.devices.get(("t1", "a"))
    assert stored is not None and stored.metadata.resource_version == "6" and not c.devices.assumed("t1", "a")


def test_a_failed_write_gives_the_units_back_once_the_fresh_version_is_in() -> None:
    """Settled after a conflict, the fresh read (someone else's newer version) is what the view holds."""
    c = cluster(nodes=[node("n1", {A10: 1})], classes=[gpu_class("a10")], devices=[with_version(device("a"), 5)])
    pending = c.devices.get(("t1", "a"))
    assert pending is not None
    token = View(c).assume(transitions.bound(pending, "n1", EPOCH)).token
    View(c).settle("t1", "a", token)
    change = View(c).apply(kinds.GPU_DEVICE, with_version(device("a", phase="Pending"), 7))
    assert c.devices.held_by_class("n1") == {}
    assert change.room == {"a10"}  # waiting devices of the class are looked at again


def test_settling_an_earlier_assumption_leaves_a_later_one_in_place() -> None:
    """A write that lost settles only its own assumption: one made on the device since (an answer to a request
    that arrived meanwhile) keeps its units counted until its own write is done."""
    c = cluster(nodes=[node("n1", {A10: 1})], classes=[gpu_class("a10")], devices=[with_version(device("a"), 5)])
    pending = c.devices.get(("t1", "a"))
    assert pending is not None
    first = View(c).assume(transitions.bound(pending, "n1", EPOCH)).token
    second = View(c).assume(transitions.bound(pending, "n1", EPOCH)).token
    assert not View(c).settle("t1", "a", first)
    assert c.devices.assumed("t1", "a") and c.devices.held_by_class("n1") == {"a10": 1}
    assert View(c).settle("t1", "a", second) and not c.devices.assumed("t1", "a")


def test_a_node_heartbeat_is_no_capacity_change() -> None:
    """The same node at a newer version, nothing a decision reads changed: no retry of waiting devices.
    More allocatable is room; a cordon is neither room nor a reason read anew (the node keeps the resource), and
    its end is room again (the node serves once more)."""
    c = cluster(nodes=[with_version(node("n1", {A10: 2}), 1)], classes=[gpu_class("a10")])
    assert View(c).apply(kinds.NODE, with_version(node("n1", {A10: 2}), 2)).room == frozenset()
    grown = View(c).apply(kinds.NODE, with_version(node("n1", {A10: 3}), 3))
    assert (grown.room, grown.served) == ({"a10"}, frozenset())
    cordoned = View(c).apply(kinds.NODE, with_version(node("n1", {A10: 3}, unschedulable=True), 4))
    assert (cordoned.room, cordoned.served) == (frozenset(), frozenset())
    uncordoned = View(c).apply(kinds.NODE, with_version(node("n1", {A10: 3}), 5))
    assert (uncordoned.room, uncordoned.served) == ({"a10"}, frozenset())


ALLOCATABLE = {"n1": 4, "n2": 3}  # units of A10 per node


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 3), min_size=1, max_size=12),
    st.lists(st.sampled_from(["ok", "conflict", "echo", "list"]), min_size=12, max_size=12),
    st.randoms(use_true_random=False),
)
def test_pipelined_decisions_never_spend_a_unit_twice(counts: list[int], outcomes: list[str], rnd: Any) -> None:
    """Decide every waiting device in memory (assumed), then let the writes land in any order: succeeded,
    lost to a conflict, or overtaken by events of the old version. At every step no node holds more than
    it has, and the counters placement reads (held, taken, best fit) equal a recount from the devices."""
    c = cluster(
        nodes=[node(n, {A10: u}) for n, u in ALLOCATABLE.items()],
        classes=[gpu_class("a10")],
        devices=[with_version(device(f"d{i}", count=n), 10 + i) for i, n in enumerate(counts)],
    )
    inflight: list[tuple[GPUDevice, str, int]] = []
    for i in range(len(counts)):
        current = c.devices.get(("t1", f"d{i}"))
        assert current is not None
        outcome = place(c, [current])
        if isinstance(outcome, Placement):
            decided = transitions.bound(current, outcome.node, EPOCH)
            inflight.append((decided, outcomes[i], View(c).assume(decided).token))
        check(c)
    rnd.shuffle(inflight)
    for decided, how, token in inflight:
        name, rv = decided.name, int(decided.metadata.resource_version or 0)
        if how in ("echo", "list"):
            View(c).apply(
                kinds.GPU_DEVICE, with_version(device(name, count=decided.spec.count), rv)
            )  # the old version again
            check(c)
            # A device arriving now is decided on what the view says is free.
            late = GPUDevice.from_wire(with_version(device(f"late-{name}"), 1))
            View(c).apply(kinds.GPU_DEVICE, late.wire())
            if isinstance(outcome := place(c, [late]), Placement):
                View(c).assume(transitions.bound(late, outcome.node, EPOCH))
            check(c)
        View(c).settle("t1", name, token)
        if how == "conflict":
            View(c).apply(
                kinds.GPU_DEVICE, with_version(device(name, count=decided.spec.count, phase="Pending"), rv + 100)
            )
        else:
            View(c).apply(kinds.GPU_DEVICE, with_version(decided.wire(), rv + 100))
        check(c)


def check(c: Cluster) -> None:
    """The counters placement reads equal a recount from the stored device bodies: per node the units held and
    taken, the class's held units, and the best-fit order of free units; and no node holds more than it has."""
    recount: dict[str, int] = {}
    for d in c.devices.values():
        body = d.wire()
        status = body.get("status") or {}
        if status.get("phase") == "Bound":
            recount[status["nodeName"]] = recount.get(status["nodeName"], 0) + body["spec"]["count"]
    for name, units in ALLOCATABLE.items():
        held = recount.get(name, 0)
        assert held <= units, f"{name} overcommitted: {held} of {units} held"
        assert c.capacity.held_units(name) == ({A10: held} if held else {}), name
        assert c.capacity.taken_units(name) == ({A10: held} if held else {}), name
    assert c.capacity.held_of_class("a10") == sum(recount.values())
    free = sorted((units - recount.get(name, 0), name) for name, units in ALLOCATABLE.items())
    for units in range(1, max(ALLOCATABLE.values()) + 1):
        fits = [name for left, name in free if left >= units]
        assert list(c.capacity.best_fit(A10, units)) == fits, f"nodes with {units} free of {A10}"
        assert list(c.capacity.serving.best_fit("a10", units)) == fits, f"nodes serving a10 with {units} free"
