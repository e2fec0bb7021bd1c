"""A waiting room whose cost per event does not grow with it (§5.5, §14.3).

The binder's pass without its I/O: `waiting.to_decide` picks what an event could change,
`place` decides each, and each decision lands in the view as the binder's write would.
Counted: decisions per pass and the nodes looked at per decision. Checked against the
rule: the view's serving index equals a recount, and after every event nothing a full
pass would place is left waiting.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cozygpu.api import GPUDevice, kinds
from cozygpu.decisions import transitions
from cozygpu.decisions.placement import Placement, place, place_scanning
from cozygpu.decisions.waiting import fits_now, in_turn, must_decide, overtakes, to_decide
from cozygpu.runtime.view import View
from cozygpu.state import serving
from cozygpu.state.cluster import Change, Cluster, DeviceKey
from tests.support.views import A10, EPOCH, L40S, cluster, device, gpu_class, node, pod, rv


class CountingNodes(Mapping[str, Any]):
    """The view's nodes as decisions read them, counting every node a decision looks at."""

    visits = 0

    def __init__(self, nodes: Mapping[str, Any]) -> None:
        self._nodes = nodes

    def __getitem__(self, key: str) -> Any:
        CountingNodes.visits += 1
        return self._nodes[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)


class Binder:
    """The binder's bookkeeping and pass, with every write landing at once as a newer version."""

    def __init__(self, c: Cluster) -> None:
        self.c = c
        self.c.capacity.nodes = CountingNodes(c.capacity.nodes)
        self.room: set[str] = set()
        self.served: set[str] = set()
        self.fresh: set[DeviceKey] = set()
        self.first = True
        self.rest: list[GPUDevice] = []
        self.between: Any = None  # called after each decision: an event landing while a write yields

    def apply(self, kind: str, body: dict[str, Any], *, deleted: bool = False) -> Change:
        change = View(self.c).apply(kind, body, deleted=deleted)
        if change.stored:
            if kind is kinds.GPU_DEVICE and not deleted:
                self.fresh.add((change.namespace, change.name))
            self.room |= change.room
            self.served |= change.served
        return change

    def one_pass(self) -> tuple[int, int]:
        """(decisions, most nodes one decision looked at)."""
        if self.first:
            musts, room, self.first = in_turn(self.c), set(), False
        else:
            musts, room = must_decide(self.c, self.served, self.fresh), self.room - self.served
            musts = sorted({(x.namespace, x.name): x for x in [*self.rest, *musts]}.values(), key=self.c.devices.turn)
        self.room, self.served, self.fresh, self.rest = set(), set(), set(), []
        decisions = most = 0
        for d, for_room in to_decide(self.c, musts, room):
            if for_room and not fits_now(self.c, d):
                continue
            current = self.c.devices.get((d.namespace or "", d.name))
            if current is None or not current.awaits_node:
                continue
            if overtakes(self.c, current):  # as the binder: an older device of the class fits, it goes first
                self.room.add(current.spec.class_name)
                self.rest = [x for x in musts if self.c.devices.turn(x) >= self.c.devices.turn(current)]
                return decisions, most
            CountingNodes.visits = 0
            outcome = place(self.c, [current])
            decisions, most = decisions + 1, max(most, CountingNodes.visits)
            new = (
                transitions.bound(current, outcome.node, EPOCH)
                if isinstance(outcome, Placement)
                else transitions.waiting(current, outcome.message, EPOCH)
            )
            if new != current:
                body = new.wire()
                body["metadata"]["resourceVersion"] = rv()
                self.apply(kinds.GPU_DEVICE, body)
            if self.between is not None:
                self.between()
        return decisions, most

    def settle(self) -> list[tuple[int, int]]:
        """Passes until nothing is left to decide, as the binder's loop runs them."""
        passes = [self.one_pass()]
        while self.room or self.served or self.fresh or self.rest:
            passes.append(self.one_pass())
            assert len(passes) < 50, "the passes never settle"
        return passes


def backlog_cloud(nodes: int, backlog: int) -> Binder:
    """A cloud of full-ish nodes and a backlog of devices whose class no node serves."""
    c = cluster(
        nodes=[node(f"n{i:04}", {A10: 8}) for i in range(nodes)],
        classes=[gpu_class("a10"), gpu_class("nowhere", nodeSelector={"pool": "none"})],
        devices=[device(f"w{i:04}", "nowhere", namespace="a", created=i) for i in range(backlog)],
    )
    b = Binder(c)
    b.settle()
    return b


def test_a_backlog_no_node_serves_is_never_visited_by_another_tenants_churn() -> None:
    """§14.3: creating, binding and deleting one placeable device, again and again, decides that device alone;
    the 300 devices waiting for a class no node serves are not looked at, and no decision scans the nodes."""
    b = backlog_cloud(nodes=200, backlog=300)
    assert all(d.status.phase is not None for d in b.c.devices.values())
    for i in range(30):
        b.apply(kinds.GPU_DEVICE, device(f"churn-{i}", namespace="a", created=10_000 + i))
        passes = b.settle()
        assert sum(n for n, _ in passes) == 1 and max(m for _, m in passes) == 0
        bound = b.c.devices.get(("a", f"churn-{i}"))
        assert bound is not None and bound.holds_gpus
        b.apply(kinds.GPU_DEVICE, bound.wire(), deleted=True)
        passes = b.settle()
        assert sum(n for n, _ in passes) == 0


def test_a_node_flapping_does_not_decide_a_classes_whole_backlog_again() -> None:
    """§14.3: 300 devices wait for 9 units no node has; one of 200 nodes goes NotReady and comes back, again and
    again: nothing is decided (their reason reads the same), where each flap decided all 300 before."""
    c = cluster(
        nodes=[node(f"n{i:04}", {A10: 8}) for i in range(200)],
        classes=[gpu_class("a10")],
        devices=[device(f"w{i:04}", count=9, namespace="a", created=i) for i in range(300)],
    )
    b = Binder(c)
    b.settle()
    assert all(d.status.phase is not None for d in c.devices.values())
    for i in range(10):
        flapped = node("n0007", {A10: 8}, ready=i % 2 == 1)
        b.apply(kinds.NODE, {**flapped, "metadata": {**flapped["metadata"], "resourceVersion": rv()}})
        assert sum(n for n, _ in b.settle()) == 0


def test_an_unplaceable_device_is_found_so_without_a_scan() -> None:
    """§14.3: a new device no node can take costs the reasons shown, not a look at every node; its message is
    the one a scan of every node writes."""
    b = backlog_cloud(nodes=500, backlog=0)
    b.apply(kinds.GPU_DEVICE, device("big", count=9, namespace="a"))
    b.apply(kinds.GPU_DEVICE, device("stray", "nowhere", namespace="a"))
    passes = b.settle()
    assert sum(n for n, _ in passes) == 4  # each decided, and once more on its own waiting write's echo
    assert max(m for _, m in passes) <= 4
    for name in ("big", "stray"):
        d = b.c.devices.get(("a", name))
        assert d is not None
        assert d.status.message == place_scanning(b.c, [d]).message  # type: ignore[union-attr]


def test_freed_units_wake_the_oldest_device_that_fits_and_no_more() -> None:
    """§5.5: a full pool with 100 one-unit devices waiting: a freed unit goes to the oldest, and the pass
    decides just that one; the rest keep waiting without being looked at."""
    c = cluster(
        nodes=[node("n1", {A10: 2})],
        classes=[gpu_class("a10")],
        devices=[device("h0", phase="Bound", node_name="n1"), device("h1", phase="Bound", node_name="n1")]
        + [device(f"w{i:03}", created=i + 1) for i in range(100)],
    )
    b = Binder(c)
    b.settle()
    gone = c.devices.get(("t1", "h0"))
    assert gone is not None
    b.apply(kinds.GPU_DEVICE, gone.wire(), deleted=True)
    decisions = sum(n for n, _ in b.settle())
    assert decisions == 1
    placed = c.devices.get(("t1", "w000"))
    assert placed is not None and placed.holds_gpus
    assert [d.name for d in in_turn(c)][:1] == ["w001"]


def check_index(c: Cluster) -> None:
    """The serving index equals the rule applied to every node now."""
    for cls in c.classes.values():
        name, resource = cls.name, cls.spec.resource_name
        serves = {n for n, info in c.capacity.nodes.items() if name in serving.serving(info, c.classes.values())}
        free = [(c.capacity.nodes[n].free(resource, c.capacity.taken_units(n).get(resource, 0)), n) for n in serves]
        assert c.capacity.serving.fullest_first(name, 10_000) == sorted(free, key=lambda x: (-x[0], x[1]))
        others = sorted(n for n, info in c.capacity.nodes.items() if resource in info.allocatable and n not in serves)
        assert c.capacity.serving.unserved(name, 10_000) == others
        assert c.capacity.serving.counts(name) == (len(serves), len(others))


NODES = [f"n{i}" for i in range(5)]
CLASSES = {"a10": A10, "zoned": A10, "l40s": L40S}


def random_event(b: Binder, rnd: random.Random, step: int) -> None:
    c = b.c
    what = rnd.choice(["node", "node", "node-gone", "device", "device", "device", "delete", "class", "pod"])
    if what == "node":
        labels = {"zone": rnd.choice(["x", "y"])}
        gpus = {rnd.choice([A10, L40S]): rnd.randint(0, 4)}
        b.apply(
            kinds.NODE,
            node(rnd.choice(NODES), gpus, labels=labels, ready=rnd.random() > 0.2, unschedulable=rnd.random() < 0.2),
        )
    elif what == "node-gone" and c.capacity.nodes:
        b.apply(kinds.NODE, {"metadata": {"name": rnd.choice(sorted(c.capacity.nodes))}}, deleted=True)
    elif what == "device":
        b.apply(kinds.GPU_DEVICE, device(f"d{step}", rnd.choice(sorted(CLASSES)), rnd.randint(1, 3), created=step))
    elif what == "delete" and c.devices:
        gone = c.devices[rnd.choice(sorted(c.devices))]
        b.apply(kinds.GPU_DEVICE, gone.wire(), deleted=True)
    elif what == "class":
        zone = rnd.choice(["x", "y", None])
        b.apply(
            kinds.GPU_CLASS,
            gpu_class(
                "zoned", A10, rnd.choice(["passthrough", "vgpu"]), **({"nodeSelector": {"zone": zone}} if zone else {})
            ),
        )
    elif what == "pod" and c.capacity.nodes:
        b.apply(
            kinds.POD,
            pod(
                "job",
                {A10: rnd.randint(0, 2)},
                node=rnd.choice(sorted(c.capacity.nodes)),
                phase=rnd.choice(["Running", "Succeeded"]),
            ),
        )


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_after_any_events_the_index_holds_and_nothing_placeable_is_left_waiting(seed: int) -> None:
    """Random nodes, classes, pods and devices coming and going: after each event's passes the serving index
    equals the rule, every waiting device has been decided, none of them fits anywhere (a full scan
    agrees: the passes that skip what cannot fit miss nothing that can), and each says why as a scan would now
    (a node's change decides a class's whole backlog again only where that reason reads differently)."""
    rnd = random.Random(seed)
    b = Binder(cluster(classes=[gpu_class(n, r) for n, r in CLASSES.items()]))
    b.settle()
    for step in range(40):
        random_event(b, rnd, step)
        b.settle()
        check_index(b.c)
        for d in list(b.c.devices.values()):
            if d.awaits_node:
                assert d.status.phase is not None, d.name
                outcome = place_scanning(b.c, [d])
                assert not isinstance(outcome, Placement), d.name
                assert (d.status.message or "").endswith(outcome.message), (d.name, d.status.message)


def test_waiting_devices_by_class_and_size_are_what_the_view_holds() -> None:
    """`Cluster.devices.waiting` lists the class's devices that await a node, in turn, up to a size."""
    c = cluster(
        classes=[gpu_class("a10")],
        devices=[
            device("a", count=2, created=2),
            device("b", created=1),
            device("c", count=3, created=0),
            device("t", template=True),
            device("h", phase="Bound", node_name="n1"),
        ],
    )
    assert [d.name for d in c.devices.waiting("a10")] == ["c", "b", "a"]
    assert [d.name for d in c.devices.waiting("a10", 2)] == ["b", "a"]
    assert all(isinstance(d, GPUDevice) for d in c.devices.waiting("a10"))


def test_room_freed_while_a_pass_is_under_way_goes_to_the_oldest_device_of_the_class() -> None:
    """§5.5: O waits on a full node; A (no node serves its class) and F (O's class, younger) arrive; a unit is
    freed while A's waiting write is out: O gets it, F keeps waiting."""
    c = cluster(
        nodes=[node("n1", {A10: 1})],
        classes=[gpu_class("a10"), gpu_class("nowhere", nodeSelector={"pool": "none"})],
        devices=[device("h", phase="Bound", node_name="n1"), device("o", created=1)],
    )
    b = Binder(c)
    b.settle()
    b.apply(kinds.GPU_DEVICE, device("a", "nowhere", created=2))
    b.apply(kinds.GPU_DEVICE, device("f", created=3))
    held = c.devices.get(("t1", "h"))
    assert held is not None

    def free_the_unit() -> None:
        b.between = None
        b.apply(kinds.GPU_DEVICE, held.wire(), deleted=True)

    b.between = free_the_unit
    b.settle()
    o, f = c.devices.get(("t1", "o")), c.devices.get(("t1", "f"))
    assert o is not None and o.holds_gpus
    assert f is not None and not f.holds_gpus
