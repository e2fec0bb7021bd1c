"""GPUNode status (§1.3, §8): resources, classes, LostCapacity and ClassConflict."""

from __future__ import annotations

from cozygpu.api import ConditionStatus, GPUNodeStatus, NodeResource
from cozygpu.decisions.nodestatus import gpunode_status
from tests.builders import A10, EPOCH, L40S, cluster, device, gpu_class, node


def condition(status: GPUNodeStatus, type_: str) -> tuple[ConditionStatus, str]:
    c = next(c for c in status.conditions if c.type == type_)
    return c.status, c.message


def test_resources_classes_and_summary() -> None:
    """Per resource: allocatable from the Node, held by Bound devices, free; the classes served."""
    c = cluster(
        nodes=[node("n1", {A10: 4})],
        classes=[gpu_class("a10")],
        devices=[device("a", count=3, phase="Bound", node_name="n1")],
    )
    status = gpunode_status(c, "n1", [], EPOCH)
    assert status is not None
    assert status.resources == [NodeResource(name=A10, allocatable=4, held=3, free=1)]
    assert status.classes == ["a10"]
    assert status.summary == f"{A10} 3/4"
    assert condition(status, "LostCapacity")[0] is ConditionStatus.FALSE


def test_fewer_units_than_held_is_lost_capacity() -> None:
    """§1.3: a GPU fell off the bus: held exceeds what the node serves now."""
    c = cluster(
        nodes=[node("n1", {A10: 1})],
        classes=[gpu_class("a10")],
        devices=[device("a", count=2, phase="Bound", node_name="n1")],
    )
    status = gpunode_status(c, "n1", [], EPOCH)
    assert status is not None
    assert condition(status, "LostCapacity") == (ConditionStatus.TRUE, f"{A10}: 2 held, 1 allocatable")


def test_not_ready_with_devices_bound_is_lost_capacity() -> None:
    """§1.3: NotReady with devices bound; NotReady and empty is not."""
    bound = cluster(
        nodes=[node("n1", {A10: 2}, ready=False)],
        classes=[gpu_class("a10")],
        devices=[device("a", phase="Bound", node_name="n1")],
    )
    empty = cluster(nodes=[node("n1", {A10: 2}, ready=False)], classes=[gpu_class("a10")])
    s1, s2 = gpunode_status(bound, "n1", [], EPOCH), gpunode_status(empty, "n1", [], EPOCH)
    assert s1 is not None and s2 is not None
    assert condition(s1, "LostCapacity")[0] is ConditionStatus.TRUE
    assert condition(s2, "LostCapacity")[0] is ConditionStatus.FALSE


def test_a_gone_node_with_devices_is_lost_capacity() -> None:
    """§1.3: the node is gone but devices still name it."""
    c = cluster(classes=[gpu_class("a10")], devices=[device("a", phase="Bound", node_name="n1")])
    status = gpunode_status(c, "n1", [], EPOCH)
    assert status is not None
    assert condition(status, "LostCapacity")[0] is ConditionStatus.TRUE


def test_class_conflict_names_the_classes() -> None:
    """§8.2: ClassConflict is True with the clashing classes, which are not served."""
    c = cluster(nodes=[node("n1", {A10: 2, L40S: 2})], classes=[gpu_class("a10"), gpu_class("l40s", L40S, "vgpu")])
    status = gpunode_status(c, "n1", [], EPOCH)
    assert status is not None
    assert condition(status, "ClassConflict") == (
        ConditionStatus.TRUE,
        "classes that cannot be served together: a10, l40s",
    )
    assert status.classes == []


def test_a_node_that_serves_nothing_has_no_gpunode() -> None:
    """§1.3: GPUNodes exist only for nodes that serve a class (or that devices still name)."""
    c = cluster(nodes=[node("cpu-only", {})], classes=[gpu_class("a10")])
    assert gpunode_status(c, "cpu-only", [], EPOCH) is None


def test_transition_time_is_kept_while_a_condition_holds() -> None:
    """lastTransitionTime moves only when the status flips."""
    c = cluster(nodes=[node("n1", {A10: 2})], classes=[gpu_class("a10")])
    first = gpunode_status(c, "n1", [], EPOCH)
    assert first is not None
    later = gpunode_status(c, "n1", first.conditions, EPOCH.replace(year=2027))
    assert later is not None
    assert [x.last_transition_time for x in later.conditions] == [EPOCH, EPOCH]
