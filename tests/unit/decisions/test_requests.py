"""What the binder answers to a bind request (§4, §5.4), from the cluster view."""

from __future__ import annotations

import datetime as dt

from cozygpu.api import kinds
from cozygpu.decisions.placement import NoPlacement, Placement
from cozygpu.decisions.requests import Answer, Wait, assess
from cozygpu.runtime.view import View
from tests.support.views import A10, EPOCH, budget, cluster, device, gpu_class, node, request

NOW = EPOCH + dt.timedelta(seconds=5)
LATE = dt.timedelta(seconds=10)


def test_a_complete_request_is_placed() -> None:
    """Every named device carries the id: the answer is a placement of the whole set."""
    status = request("r1", "vm", ["a", "b"], EPOCH)
    c = cluster(
        nodes=[node("n1", {A10: 2})],
        classes=[gpu_class("a10")],
        devices=[device("a", status=status), device("b", status=status)],
    )
    answer = assess(c, "r1", NOW, LATE)
    assert isinstance(answer, Answer)
    assert answer.outcome == Placement("n1", ("a", "b"))
    assert [d.name for d in answer.devices] == ["a", "b"]


def test_a_request_still_being_written_waits() -> None:
    """§4: the binder answers only once every named device carries the id."""
    c = cluster(
        classes=[gpu_class("a10")], devices=[device("a", status=request("r1", "vm", ["a", "b"], EPOCH)), device("b")]
    )
    assert isinstance(assess(c, "r1", NOW, LATE), Wait)


def test_an_incomplete_request_fails_after_the_bind_timeout() -> None:
    """A request whose set never completes is answered Failed, naming the device, not left forever."""
    c = cluster(classes=[gpu_class("a10")], devices=[device("a", status=request("r1", "vm", ["a", "b"], EPOCH))])
    answer = assess(c, "r1", EPOCH + dt.timedelta(seconds=11), LATE)
    assert isinstance(answer, Answer)
    assert answer.outcome == NoPlacement("GPUDevice b does not exist")


def test_a_device_carrying_another_open_request_fails_the_request() -> None:
    """§4: a named device with another id makes the answer Failed."""
    c = cluster(
        classes=[gpu_class("a10")],
        devices=[
            device("a", status=request("r1", "vm1", ["a", "b"], EPOCH)),
            device("b", status=request("r2", "vm2", ["b"], EPOCH)),
        ],
    )
    answer = assess(c, "r1", NOW, LATE)
    assert isinstance(answer, Answer)
    assert answer.outcome == NoPlacement("GPUDevice b is part of another bind request")


def test_an_answered_request_is_not_answered_again() -> None:
    """§4: answering is idempotent."""
    c = cluster(
        classes=[gpu_class("a10")], devices=[device("a", status=request("r1", "vm", ["a"], EPOCH, result="Succeeded"))]
    )
    assert assess(c, "r1", NOW, LATE) is None


def test_orders_are_checked_against_budgets_at_bind_time() -> None:
    """§5.4: a new (template) device in the set is an order; a full budget fails the request."""
    c = cluster(
        nodes=[node("n1", {A10: 8})],
        classes=[gpu_class("a10")],
        devices=[
            device("held", count=2, phase="Bound", node_name="n1"),
            device("vm-gpu-0", count=1, template=True, status=request("r1", "vm", ["vm-gpu-0"], EPOCH)),
        ],
        budgets=[budget("cap", limits={"a10": 2})],
    )
    answer = assess(c, "r1", NOW, LATE)
    assert isinstance(answer, Answer)
    assert isinstance(answer.outcome, NoPlacement)
    assert "GPUBudget t1/cap" in answer.outcome.message


def test_held_devices_in_a_request_are_not_orders() -> None:
    """§3.9: held devices already count; a lowered budget does not fail their request."""
    c = cluster(
        nodes=[node("n1", {A10: 8})],
        classes=[gpu_class("a10")],
        devices=[device("held", count=4, phase="Bound", node_name="n1", status=request("r1", "vm", ["held"], EPOCH))],
        budgets=[budget("cap", limits={"a10": 1})],
    )
    answer = assess(c, "r1", NOW, LATE)
    assert isinstance(answer, Answer)
    assert answer.outcome == Placement("n1", ())


def test_a_device_attached_elsewhere_fails_the_request() -> None:
    """The set must be attached to the request's VMI."""
    status = request("r1", "vm", ["a"], EPOCH)
    status["attachedTo"] = {"vmi": "other"}
    c = cluster(nodes=[node("n1", {A10: 1})], classes=[gpu_class("a10")], devices=[device("a", status=status)])
    answer = assess(c, "r1", NOW, LATE)
    assert isinstance(answer, Answer)
    assert answer.outcome == NoPlacement("GPUDevice a is not attached to VMI vm")


def test_where_budgets_are_required_a_namespace_without_one_gets_no_new_units() -> None:
    """§7, `--budgets-required`: at bind time a template order in a namespace no GPUBudget covers is refused,
    naming the namespace; with a budget covering it, or without the setting, it is placed."""
    status = request("r1", "vm", ["vm-gpu-0"], EPOCH)
    templates = [device("vm-gpu-0", template=True, status=status)]
    c = cluster(nodes=[node("n1", {A10: 2})], classes=[gpu_class("a10")], devices=templates)
    refused = assess(c, "r1", NOW, LATE, budgets_required=True)
    assert isinstance(refused, Answer) and refused.outcome == NoPlacement(
        "GPUDevice vm-gpu-0: namespace t1 has no GPUBudget, and this cluster requires one"
    )
    placed = assess(c, "r1", NOW, LATE)
    assert isinstance(placed, Answer) and isinstance(placed.outcome, Placement)
    View(c).apply(kinds.GPU_BUDGET, budget("cap", "t1", total=4))
    covered = assess(c, "r1", NOW, LATE, budgets_required=True)
    assert isinstance(covered, Answer) and isinstance(covered.outcome, Placement)


def test_a_request_for_a_class_not_ready_waits_then_is_refused_after_the_bind_timeout() -> None:
    """§12.3: with the policy in force, a VM's set that would give a class moments old new units waits for the
    class to be ready, and is refused with the reason once the bind timeout passed; without it, it is placed."""
    status = request("r1", "vm", ["a"], EPOCH)
    c = cluster(
        nodes=[node("n1", {A10: 2})], classes=[gpu_class("a10", ready=False)], devices=[device("a", status=status)]
    )
    waiting = assess(c, "r1", NOW, LATE, guarded=True)
    assert isinstance(waiting, Wait) and "GPUClass a10 is not ready yet" in waiting.why
    late = assess(c, "r1", EPOCH + dt.timedelta(seconds=11), LATE, guarded=True)
    assert isinstance(late, Answer) and isinstance(late.outcome, NoPlacement)
    assert "GPUClass a10 is not ready yet" in late.outcome.message
    placed = assess(c, "r1", NOW, LATE)
    assert isinstance(placed, Answer) and placed.outcome == Placement("n1", ("a",))
