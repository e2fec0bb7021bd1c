"""Budgets and entitlements (§7): orders count against every covering budget, each counting the last."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cozygpu.api import GPUBudget, kinds
from cozygpu.api.selectors import selector_matches
from cozygpu.decisions.budgets import Held, check_orders, covering_budgets, overrun, set_aside, usage
from cozygpu.decisions.orders import Order
from cozygpu.runtime.view import View
from cozygpu.state.cluster import Cluster
from tests.support.views import budget, cluster, device, gpu_class, rv


def order(count: int, class_name: str = "a10", namespace: str = "t1", what: str = "deviceTemplate 0") -> Order:
    return Order(namespace, class_name, count, what)


def test_pending_bound_and_lost_count_against_a_budget() -> None:
    """§7.2: every phase that counts, not just Bound; a new template device is an order, not yet counted."""
    c = cluster(
        classes=[gpu_class("a10")],
        devices=[
            device("p", count=1, phase="Pending"),
            device("b", count=2, phase="Bound", node_name="n1"),
            device("l", count=4, phase="Lost", node_name="n1"),
            device("vm-gpu-0", count=8, template=True),
        ],
        budgets=[budget("b", limits={"a10": 100})],
    )
    assert usage(c, c.budgets[("t1", "b")]) == {"a10": 7}


def test_an_admitted_held_device_counts_before_the_binder_sees_it() -> None:
    """A held device without a phase was admitted as an order already; it counts (§7.4)."""
    c = cluster(classes=[gpu_class("a10")], devices=[device("new", count=3)], budgets=[budget("b", limits={"a10": 4})])
    assert usage(c, c.budgets[("t1", "b")]) == {"a10": 3}
    assert check_orders(c, [order(2)]) is not None


def test_prior_orders_count_but_are_not_checked() -> None:
    """Reservations (admitted, not yet in the view) use up room for later orders."""
    c = cluster(classes=[gpu_class("a10")], budgets=[budget("b", limits={"a10": 3})])
    prior = [order(3, what="GPUDevice earlier")]
    assert check_orders(c, [], prior) is None
    refusal = check_orders(c, [order(1)], prior)
    assert refusal is not None
    assert "3 are in use" in refusal


def test_an_order_within_the_limit_passes_and_one_beyond_fails() -> None:
    """§7.1: used + n must stay within the class's limit; the message names the budget and the numbers."""
    c = cluster(
        classes=[gpu_class("a10")],
        devices=[device("b", count=3, phase="Bound", node_name="n1")],
        budgets=[budget("cap", limits={"a10": 4})],
    )
    assert check_orders(c, [order(1)]) is None
    refusal = check_orders(c, [order(2)])
    assert refusal == (
        "deviceTemplate 0: GPUBudget t1/cap allows 4 units of GPUClass a10 and 3 are in use; 2 more would exceed it"
    )


def test_orders_count_each_other() -> None:
    """§3.9/§7.1: the second order sees the first as used."""
    c = cluster(classes=[gpu_class("a10")], budgets=[budget("cap", limits={"a10": 3})])
    refusal = check_orders(c, [order(2, what="deviceTemplate 0"), order(2, what="deviceTemplate 1")])
    assert refusal is not None
    assert refusal.startswith("deviceTemplate 1:")


def test_total_caps_all_classes_together() -> None:
    """§1.4: total limits units over every class, named or not in limits."""
    c = cluster(
        classes=[gpu_class("a10"), gpu_class("h100", "nvidia.com/H100")],
        devices=[device("b", "h100", 2, phase="Bound", node_name="n1")],
        budgets=[budget("cap", total=3)],
    )
    assert check_orders(c, [order(1)]) is None
    refusal = check_orders(c, [order(2)])
    assert refusal is not None
    assert "allows 3 units in total and 2 are in use" in refusal


def test_a_class_not_in_limits_is_unlimited_without_total() -> None:
    """§1.4: a class the budget does not name is not limited by it."""
    c = cluster(classes=[gpu_class("a10"), gpu_class("h100")], budgets=[budget("cap", limits={"h100": 0})])
    assert check_orders(c, [order(50)]) is None


def test_an_overrun_names_the_budget_the_extra_orders_push_over_and_no_other() -> None:
    """§7.4 across replicas: use in the view plus orders admitted elsewhere; a limit reached exactly is no overrun,
    one more unit is, and a total counts every class."""
    c = cluster(
        classes=[gpu_class("a10"), gpu_class("h100")],
        devices=[device("b", count=2, phase="Bound", node_name="n1")],
        budgets=[budget("cap", limits={"a10": 3}), budget("all", total=4)],
    )
    assert overrun(c, [order(1)]) == {}
    assert list(overrun(c, [order(2)])) == [("t1", "cap")]
    assert "GPUBudget t1/cap allows 3 units of GPUClass a10, and 4" in overrun(c, [order(2)])[("t1", "cap")].why
    assert overrun(c, [order(2)])[("t1", "cap")].fed_by([order(1)])
    assert not overrun(c, [order(2)])[("t1", "cap")].fed_by([order(1, "h100")])  # another class gives no way
    assert list(overrun(c, [order(1), order(2, "h100")])) == [("t1", "all")]
    assert overrun(c, []) == {} and overrun(c, [order(5, namespace="t2")]) == {}


def test_a_parent_budget_covers_matching_namespaces() -> None:
    """§1.4: a budget with namespaceSelector covers those namespaces, counting their devices together."""
    c = cluster(
        classes=[gpu_class("a10")],
        devices=[device("x", count=2, namespace="child-a", phase="Bound", node_name="n1")],
        budgets=[
            budget(
                "tenant", namespace="parent", limits={"a10": 3}, namespaceSelector={"matchLabels": {"tenant": "acme"}}
            )
        ],
        namespaces={"parent": {}, "child-a": {"tenant": "acme"}, "child-b": {"tenant": "acme"}, "other": {}},
    )
    assert [b.name for b in covering_budgets(c, "child-b")] == ["tenant"]
    assert covering_budgets(c, "other") == []
    refusal = check_orders(c, [order(2, namespace="child-b")])
    assert refusal is not None
    assert "GPUBudget parent/tenant" in refusal
    assert check_orders(c, [order(5, namespace="other")]) is None


def test_entitlement_follows_the_class_namespace_selector() -> None:
    """§1.1: only namespaces the class's namespaceSelector matches may order it."""
    c = cluster(
        classes=[gpu_class("a10", namespaceSelector={"matchLabels": {"gpu-tier": "gold"}})],
        namespaces={"t1": {"gpu-tier": "gold"}, "t2": {}},
    )
    assert check_orders(c, [order(1, namespace="t1")]) is None
    assert check_orders(c, [order(1, namespace="t2")]) == (
        "deviceTemplate 0: namespace t2 is not entitled to GPUClass a10"
    )


def test_a_lowered_budget_refuses_new_orders_only() -> None:
    """§7.3: what is held stays (no orders, no refusal); a new order is refused."""
    c = cluster(
        classes=[gpu_class("a10")],
        devices=[device("b", count=4, phase="Bound", node_name="n1")],
        budgets=[budget("cap", limits={"a10": 2})],
    )
    assert check_orders(c, []) is None
    assert check_orders(c, [order(1)]) is not None


def test_a_namespace_leaving_a_parent_budget_touches_that_budget() -> None:
    """§9: relabelled out of a selector, the namespace's use leaves the parent's tally, and the change says so."""
    c = cluster(
        classes=[gpu_class("a10")],
        devices=[device("x", count=2, namespace="child", phase="Bound", node_name="n1")],
        budgets=[budget("tenant", namespace="parent", namespaceSelector={"matchLabels": {"tenant": "acme"}})],
        namespaces={"parent": {}, "child": {"tenant": "acme"}},
    )
    assert usage(c, c.budgets[("parent", "tenant")]) == {"a10": 2}
    change = View(c).apply(kinds.NAMESPACE, {"metadata": {"name": "child", "labels": {}, "resourceVersion": rv()}})
    assert "parent" in change.namespaces
    assert usage(c, c.budgets[("parent", "tenant")]) == {}
    assert covering_budgets(c, "child") == []


_SELECTORS: list[dict[str, Any] | None] = [
    None,
    {"matchLabels": {"tier": "1"}},
    {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["1", "2"]}]},
    {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["ns0", "ghost"]}]},
    {},  # selects every namespace, the unknown ones too
    {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["1"]}]},
    {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]},
]
_NAMESPACES = ["ns0", "ns1", "ns2", "ns3", "ns4", "ghost"]  # "ghost" never appears as a Namespace
_budget_ops = st.lists(
    st.tuples(
        st.sampled_from(["namespace", "namespace-gone", "budget", "stale-budget", "budget-gone", "use", "unuse"]),
        st.integers(0, 5),  # which namespace, budget or device
        st.integers(0, 6),  # a label value, a selector, a namespace and phase for a device
    ),
    max_size=60,
)


def _covering_by_scan(c: Cluster, namespace: str) -> list[GPUBudget]:
    labels = c.namespace_labels(namespace)
    found = [
        b
        for b in c.budgets.values()
        if b.namespace == namespace
        or (b.spec.namespace_selector is not None and selector_matches(b.spec.namespace_selector, labels))
    ]
    return sorted(found, key=lambda b: (b.namespace or "", b.name))


def _usage_by_scan(c: Cluster, b: GPUBudget) -> dict[str, int]:
    selector = b.spec.namespace_selector
    selected = {
        ns for ns in c.namespaces if selector is not None and selector_matches(selector, c.namespace_labels(ns))
    }
    covered = {b.namespace} | selected
    used: dict[str, int] = defaultdict(int)
    for d in c.devices.values():
        if d.in_use and d.namespace in covered:
            used[d.spec.class_name] += d.spec.count
    return dict(used)


def _event(op: str, i: int, j: int) -> tuple[kinds.Kind, dict[str, Any], bool]:
    """One event as the view's door gets it: kind, body, deleted."""
    if op == "namespace":
        return (
            kinds.NAMESPACE,
            {"metadata": {"name": f"ns{i % 5}", "labels": {"tier": str(j)}, "resourceVersion": rv()}},
            False,
        )
    if op == "namespace-gone":
        return kinds.NAMESPACE, {"metadata": {"name": f"ns{i % 5}", "resourceVersion": rv()}}, True
    home = _NAMESPACES[i % 3 * 2 + 1] if i % 3 < 2 else "ghost"
    if op in ("budget", "stale-budget"):
        selector = _SELECTORS[j]
        body = budget(
            f"b{i}", namespace=home, limits={"a10": j}, **({} if selector is None else {"namespaceSelector": selector})
        )
        if op == "stale-budget":
            body["metadata"]["resourceVersion"] = "1"  # older than anything stored: ignored
        return kinds.GPU_BUDGET, body, False
    if op == "budget-gone":
        return kinds.GPU_BUDGET, {"metadata": {"name": f"b{i}", "namespace": home, "resourceVersion": rv()}}, True
    namespace = _NAMESPACES[j % 6]
    if op == "use":  # the same device flips between counted and not (§7.2)
        phase, template = [("Bound", False), ("Pending", False), (None, False), (None, True)][(i + j) % 4]
        body = device(
            f"d{i}",
            ("a10", "l40")[i % 2],
            1 + i,
            namespace=namespace,
            phase=phase,
            template=template,
            node_name="n1" if phase == "Bound" else None,
        )
        return kinds.GPU_DEVICE, body, False
    return kinds.GPU_DEVICE, {"metadata": {"name": f"d{i}", "namespace": namespace, "resourceVersion": rv()}}, True


@settings(max_examples=400, deadline=None)
@given(_budget_ops)
def test_budget_coverage_and_use_always_match_a_scan(ops: list[tuple[str, int, int]]) -> None:
    """The budget index (who covers a namespace, each budget's use) equals walking every budget, namespace
    and device, through namespaces that come, change labels and go, budgets that change selectors or arrive
    stale, devices that start and stop counting; and every budget whose use moved is one the change's
    namespaces lead the accountant to (§9)."""
    c = cluster(classes=[gpu_class("a10"), gpu_class("l40")])
    before: dict[tuple[str, str], dict[str, int]] = {}
    for op, i, j in ops:
        kind, body, deleted = _event(op, i, j)
        change = View(c).apply(kind, body, deleted=deleted)
        now = {(b.namespace or "", b.name): _usage_by_scan(c, b) for b in c.budgets.values()}
        reached = {(b.namespace or "", b.name) for ns in change.namespaces for b in covering_budgets(c, ns)}
        for key, used in now.items():
            if before.get(key) != used:
                assert key in reached, f"{op}: budget {key} went from {before.get(key)} to {used} untouched"
        before = now
    for ns in _NAMESPACES:
        assert covering_budgets(c, ns) == _covering_by_scan(c, ns)
    for b in c.budgets.values():
        assert usage(c, b) == _usage_by_scan(c, b)


def test_a_view_behind_the_budgets_count_counts_that_count() -> None:
    """§7.4: the accountant took orders off the budget once `used` had their devices; a replica whose watch of
    devices has not delivered that far counts the budget's `used` where it is more than its own view's, and its
    own view again once the watch has caught up."""
    b = budget("cap", limits={"a10": 2})
    b["status"] = {"used": {"a10": 2}, "usedTotal": 2, "countedThrough": "500"}
    c = cluster(classes=[gpu_class("a10")], budgets=[b])
    order = [Order("t1", "a10", 1, "GPUDevice x")]
    View(c).progressed(kinds.GPU_DEVICE, "499")
    assert usage(c, c.budgets[("t1", "cap")]) == {"a10": 2}
    assert check_orders(c, order) is not None
    View(c).progressed(kinds.GPU_DEVICE, "500")
    assert usage(c, c.budgets[("t1", "cap")]) == {}
    assert check_orders(c, order) is None


# -- set-asides (§7.4, §13.5) ------------------------------------------------------------------------------------


def test_a_replicas_set_asides_of_all_classes_stay_within_a_total_with_what_is_counted() -> None:
    """A total of 40 with 30 counted: a replica holding 9 unused l40s units sets aside no a10 units, since with
    its l40s units the budget has 1 left (not a quarter of the 10 the orders alone leave: 41 of 40)."""
    c = cluster(classes=[gpu_class("a10"), gpu_class("l40s")], budgets=[budget("b", total=40)])
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    held = {"l40s": Held(units=9, taken=0, expires=now + dt.timedelta(seconds=60))}
    got = set_aside(
        c, c.budgets[("t1", "b")], held, {"a10"}, [order(30)], now=now, ttl=dt.timedelta(seconds=30), most=32
    )

    assert got.get("l40s", (0,))[0] == 9
    assert sum(units for units, _ in got.values()) + 30 <= 40, got
