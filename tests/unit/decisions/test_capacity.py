"""What a node serves, holds and has free (§5.1, §8)."""

from __future__ import annotations

from cozygpu.decisions.capacity import conflicts, free, held, matching_classes, node_serves, served_classes
from tests.support.views import A10, L40S, cluster, device, gpu_class, node


def test_a_node_matches_classes_by_selector_and_resource() -> None:
    """A class matches a node that carries its labels and its resource."""
    c = cluster(
        nodes=[node("n1", {A10: 2}, labels={"gpu": "a10"})],
        classes=[
            gpu_class("a10", nodeSelector={"gpu": "a10"}),
            gpu_class("other", nodeSelector={"gpu": "x"}),
            gpu_class("l40s", L40S, "vgpu"),
        ],
    )
    assert [x.name for x in matching_classes(c, c.capacity.nodes["n1"])] == ["a10"]


def test_passthrough_next_to_vgpu_is_a_conflict() -> None:
    """§8.2: a node cannot serve passthrough and vGPU at once; every class in the clash conflicts."""
    c = cluster(
        nodes=[node("n1", {A10: 2, L40S: 4})],
        classes=[gpu_class("a10"), gpu_class("l40s", L40S, "vgpu")],
    )
    matching = matching_classes(c, c.capacity.nodes["n1"])
    assert conflicts(matching) == {"a10", "l40s"}
    assert served_classes(c, c.capacity.nodes["n1"]) == []
    verdict = node_serves(c, c.capacity.nodes["n1"], c.classes["a10"])
    assert not verdict.ok
    assert "class conflict" in verdict.reason


def test_one_resource_under_two_modes_is_a_conflict() -> None:
    """§8.2: two classes with one resource name and different modes conflict (alone they'd be fine)."""
    c = cluster(nodes=[node("n1", {A10: 2})], classes=[gpu_class("p", A10), gpu_class("v", A10, "vgpu")])
    assert conflicts(matching_classes(c, c.capacity.nodes["n1"])) == {"p", "v"}


def test_two_passthrough_classes_on_one_resource_do_not_conflict() -> None:
    """Same mode, same resource: both are served."""
    c = cluster(nodes=[node("n1", {A10: 2})], classes=[gpu_class("a"), gpu_class("b")])
    assert conflicts(matching_classes(c, c.capacity.nodes["n1"])) == set()
    assert [x.name for x in served_classes(c, c.capacity.nodes["n1"])] == ["a", "b"]


def test_held_counts_bound_devices_of_every_namespace_only() -> None:
    """§5.1: free = allocatable - units of Bound devices of every namespace; Pending and Lost hold nothing."""
    c = cluster(
        nodes=[node("n1", {A10: 8})],
        classes=[gpu_class("a10")],
        devices=[
            device("a", count=2, namespace="t1", phase="Bound", node_name="n1"),
            device("b", count=3, namespace="t2", phase="Bound", node_name="n1"),
            device("c", count=1, namespace="t1", phase="Lost", node_name="n1"),
            device("d", count=1, namespace="t1", phase="Pending"),
        ],
    )
    assert held(c, "n1") == {A10: 5}
    assert free(c.capacity.nodes["n1"], held(c, "n1"), A10) == 3


def test_free_never_goes_below_zero() -> None:
    """A node that lost capacity (held > allocatable) has no free units, not negative ones (§5.6)."""
    c = cluster(
        nodes=[node("n1", {A10: 1})],
        classes=[gpu_class("a10")],
        devices=[device("a", count=2, phase="Bound", node_name="n1")],
    )
    assert free(c.capacity.nodes["n1"], held(c, "n1"), A10) == 0


def test_unready_cordoned_and_tainted_nodes_do_not_serve() -> None:
    """§5.1: Ready, schedulable, taints tolerated; each refusal says which."""
    taint = {"key": "gpu", "value": "only", "effect": "NoSchedule"}
    c = cluster(
        nodes=[
            node("down", {A10: 1}, ready=False),
            node("cordoned", {A10: 1}, unschedulable=True),
            node("tainted", {A10: 1}, taints=[taint]),
        ],
        classes=[gpu_class("a10"), gpu_class("tol", tolerations=[{"key": "gpu", "operator": "Exists"}])],
    )
    assert "not Ready" in node_serves(c, c.capacity.nodes["down"], c.classes["a10"]).reason
    assert "cordoned" in node_serves(c, c.capacity.nodes["cordoned"], c.classes["a10"]).reason
    assert "taint gpu=only:NoSchedule" in node_serves(c, c.capacity.nodes["tainted"], c.classes["a10"]).reason
    assert node_serves(c, c.capacity.nodes["tainted"], c.classes["tol"]).ok
