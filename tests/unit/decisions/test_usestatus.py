"""GPUBudget and GPUClass status (§1.4, §7.3, §1.1)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cozygpu.api import ConditionStatus, GPUBudget, GPUClass, kinds
from cozygpu.api.gpuclass import MAX_CLASS_NODES
from cozygpu.decisions.orders import due
from cozygpu.decisions.usestatus import ClassTotals, budget_status, class_status
from cozygpu.runtime.view import View
from tests.support.views import A10, EPOCH, L40S, budget, cluster, device, gpu_class, node, pod


def test_budget_status_counts_use_per_class_and_in_total() -> None:
    """status.used and usedTotal follow §7.2's counting."""
    c = cluster(
        classes=[gpu_class("a10"), gpu_class("h100", "nvidia.com/H100")],
        devices=[device("a", count=2, phase="Bound", node_name="n1"), device("h", "h100", 1, phase="Pending")],
        budgets=[budget("b", limits={"a10": 4}, total=6)],
    )
    status = budget_status(c, c.budgets[("t1", "b")], EPOCH)
    assert (status.used, status.used_total) == ({"a10": 2, "h100": 1}, 3)
    assert status.conditions[0].status is ConditionStatus.FALSE


def test_a_lowered_budget_is_over_budget_and_says_so() -> None:
    """§7.3: OverBudget is True with what exceeds; nothing held is taken away."""
    c = cluster(
        classes=[gpu_class("a10")],
        devices=[device("a", count=3, phase="Bound", node_name="n1")],
        budgets=[budget("b", limits={"a10": 1}, total=2)],
    )
    condition = budget_status(c, c.budgets[("t1", "b")], EPOCH).conditions[0]
    assert condition.status is ConditionStatus.TRUE
    assert "GPUClass a10: 3 used, limit 1" in condition.message
    assert "total: 3 used, limit 2" in condition.message


def test_the_count_takes_the_place_of_the_orders_whose_devices_the_watch_has_delivered() -> None:
    """§7.4: the accountant's status lets an order go once its device is counted and the view's watch has
    delivered it (`countedThrough` says how far); an order counted only from our own write's answer, one in flight
    and one not yet expired stay; an expired one leaves. orderedTotal is the units still recorded."""
    later = EPOCH + dt.timedelta(seconds=60)

    def order(name: str, count: int, expires: dt.datetime) -> dict[str, Any]:
        body = {"namespace": "t1", "name": name, "uid": f"uid-t1-{name}", "className": "a10", "count": count}
        return {**body, "expires": expires.isoformat()}

    b = budget("b", limits={"a10": 8})
    b["status"] = {
        "orders": [
            order("seen", 2, later),
            order("late", 1, later),
            order("expired", 1, EPOCH),
            order("flying", 3, later),
        ]
    }
    c = cluster(classes=[gpu_class("a10")], devices=[device("seen", count=2, phase="Pending")], budgets=[b])
    view = View(c)
    view.progressed(kinds.GPU_DEVICE, str(c.stored_version(kinds.GPU_DEVICE, ("t1", "seen"))))
    view.apply(kinds.GPU_DEVICE, device("late", phase="Pending"))  # from our own write: the watch is not there yet
    status = budget_status(c, c.budgets[("t1", "b")], EPOCH)
    assert [o.name for o in status.orders] == ["late", "flying"]
    assert (status.ordered_total, status.used_total) == (4, 3)
    assert status.counted_through == str(c.progress(kinds.GPU_DEVICE))
    assert due(status.orders) == later


def test_class_status_sums_serving_nodes() -> None:
    """§1.1: nodes that serve the class, their units, the class's held units, what is free."""
    c = cluster(
        nodes=[node("n1", {A10: 4}), node("n2", {A10: 2}), node("cpu", {})],
        classes=[gpu_class("a10")],
        devices=[device("a", count=3, phase="Bound", node_name="n1")],
    )
    status = class_status(c, GPUClass.from_wire(gpu_class("a10")))
    assert (status.nodes, status.allocatable, status.held, status.free) == (["n1", "n2"], 6, 3, 3)


def test_a_class_served_by_many_nodes_names_the_first_hundred_and_counts_them_all() -> None:
    """A class's status stays one size however many nodes serve it: the first MAX_CLASS_NODES names and nodeCount;
    the kept totals name them again only when a node joins or leaves, the same as the walk over every node."""
    names = [f"n{i:03}" for i in range(MAX_CLASS_NODES + 20)]
    c = cluster(nodes=[node(n, {A10: 1}) for n in names], classes=[gpu_class("a10")])
    totals = ClassTotals()
    for n in names:
        totals.node_changed(c, n)
    cls = GPUClass.from_wire(gpu_class("a10"))
    status = totals.status(c, cls)
    assert (status.nodes, status.node_count, status.allocatable) == (names[:MAX_CLASS_NODES], len(names), len(names))
    assert status == class_status(c, cls)
    View(c).apply(kinds.NODE, {"metadata": {"name": "n000"}}, deleted=True)
    totals.node_changed(c, "n000")
    after = totals.status(c, cls)
    assert (after.nodes, after.node_count) == (names[1 : MAX_CLASS_NODES + 1], len(names) - 1)
    assert after == class_status(c, cls)


def test_budget_model_round_trip_keeps_status() -> None:
    """A budget written with status reads back the same."""
    c = cluster(classes=[gpu_class("a10")], budgets=[budget("b", limits={"a10": 1})])
    b = c.budgets[("t1", "b")]
    written = b.model_copy(update={"status": budget_status(c, b, EPOCH)})
    assert GPUBudget.from_wire(written.wire()).status == written.status


_ops = st.lists(
    st.tuples(
        st.sampled_from(["bind", "pending", "template", "delete", "node", "node-gone", "class", "pod"]),
        st.integers(0, 5),  # which device, node or class
        st.integers(0, 3),  # which node, units, or namespace
    ),
    max_size=50,
)


@settings(max_examples=150, deadline=None)
@given(_ops)
def test_class_and_budget_figures_from_counters_equal_a_recount(ops: list[tuple[str, int, int]]) -> None:
    """§13: class totals kept per node (what the accountant uses) give the status `class_status` computes by
    walking every node, and budget use from the view's counters equals summing every device (§7.2)."""
    c = cluster(classes=[gpu_class("a10"), gpu_class("l40", L40S, nodeSelector={"gpu": "l40"})])
    totals = ClassTotals()
    versions = iter(range(1000, 100_000))

    def rv(body: dict[str, Any]) -> dict[str, Any]:
        body["metadata"]["resourceVersion"] = str(next(versions))
        return body

    for op, i, j in ops:
        cls = ("a10", "l40")[i % 2]
        if op == "bind":
            bound = device(f"d{i}", cls, 1 + j % 2, phase="Bound", node_name=f"n{j}", namespace=f"t{j % 2}")
            change = View(c).apply(kinds.GPU_DEVICE, rv(bound))
        elif op == "pending":
            change = View(c).apply(
                kinds.GPU_DEVICE, rv(device(f"d{i}", cls, 1, phase="Pending", namespace=f"t{j % 2}"))
            )
        elif op == "template":
            change = View(c).apply(kinds.GPU_DEVICE, rv(device(f"d{i}", cls, 1, template=True, namespace=f"t{j % 2}")))
        elif op == "delete":
            change = View(c).apply(
                kinds.GPU_DEVICE, {"metadata": {"namespace": f"t{j % 2}", "name": f"d{i}"}}, deleted=True
            )
        elif op == "node":
            labels = {"gpu": "l40"} if i % 2 else {}
            change = View(c).apply(kinds.NODE, rv(node(f"n{i % 4}", {A10: 2 + j, L40S: j}, labels=labels)))
        elif op == "node-gone":
            change = View(c).apply(kinds.NODE, {"metadata": {"name": f"n{i % 4}"}}, deleted=True)
        elif op == "class":
            change = View(c).apply(kinds.GPU_CLASS, rv(gpu_class("a10", A10 if j % 2 else L40S)))
        else:
            change = View(c).apply(kinds.POD, pod(f"p{i}", {A10: 1}, node=f"n{j}", version=next(versions)))
        for name in (set(c.capacity.nodes) | set(change.nodes)) if change.all_nodes else change.nodes:
            totals.node_changed(c, name)
    for cls in c.classes.values():
        assert totals.status(c, cls) == class_status(c, cls)
    for ns in ("t0", "t1"):
        recount: dict[str, int] = {}
        for d in c.devices.in_namespace(ns):
            if d.in_use:
                recount[d.spec.class_name] = recount.get(d.spec.class_name, 0) + d.spec.count
        assert c.budgets.use_in(ns) == recount
