"""GPUBudget and GPUClass status (§1.4, §7.3, §1.1)."""

from __future__ import annotations

from cozygpu.api import ConditionStatus, GPUBudget, GPUClass
from cozygpu.decisions.usestatus import budget_status, class_status
from tests.builders import A10, EPOCH, budget, cluster, device, gpu_class, node


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
    c = cluster(classes=[gpu_class("a10")], devices=[device("a", count=3, phase="Bound", node_name="n1")],
                budgets=[budget("b", limits={"a10": 1}, total=2)])  # fmt: skip
    condition = budget_status(c, c.budgets[("t1", "b")], EPOCH).conditions[0]
    assert condition.status is ConditionStatus.TRUE
    assert "GPUClass a10: 3 used, limit 1" in condition.message
    assert "total: 3 used, limit 2" in condition.message


def test_class_status_sums_serving_nodes() -> None:
    """§1.1: nodes that serve the class, their units, the class's held units, what is free."""
    c = cluster(
        nodes=[node("n1", {A10: 4}), node("n2", {A10: 2}), node("cpu", {})],
        classes=[gpu_class("a10")],
        devices=[device("a", count=3, phase="Bound", node_name="n1")],
    )
    status = class_status(c, GPUClass.from_wire(gpu_class("a10")))
    assert (status.nodes, status.allocatable, status.held, status.free) == (["n1", "n2"], 6, 3, 3)


def test_budget_model_round_trip_keeps_status() -> None:
    """A budget written with status reads back the same."""
    c = cluster(classes=[gpu_class("a10")], budgets=[budget("b", limits={"a10": 1})])
    b = c.budgets[("t1", "b")]
    written = b.model_copy(update={"status": budget_status(c, b, EPOCH)})
    assert GPUBudget.from_wire(written.wire()).status == written.status
