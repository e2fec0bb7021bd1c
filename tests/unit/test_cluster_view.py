"""The in-memory view: newest version wins, indexes follow, capacity changes are noticed."""

from __future__ import annotations

from cozygpu.state.cluster import Cluster
from tests.builders import A10, EPOCH, budget, cluster, device, gpu_class, node, request


def test_an_older_event_does_not_overwrite_a_newer_write() -> None:
    """The binder's own write (newer resourceVersion) is kept when a stale event arrives after it."""
    c = Cluster()
    newer = device("a", phase="Bound", node_name="n1")
    newer["metadata"]["resourceVersion"] = "20"
    older = device("a")
    older["metadata"]["resourceVersion"] = "10"
    c.upsert_device(newer)
    c.upsert_device(older)
    stored = c.device("t1", "a")
    assert stored is not None and stored.status.node_name == "n1"


def test_indexes_follow_a_device_that_moves() -> None:
    """devices_on and the namespace index reflect the current node only."""
    c = cluster(devices=[device("a", phase="Bound", node_name="n1")])
    moved = device("a", phase="Bound", node_name="n2")
    c.upsert_device(moved)
    assert [d.name for d in c.devices_on("n2")] == ["a"]
    assert list(c.devices_on("n1")) == []
    assert [d.name for d in c.devices_in("t1")] == ["a"]


def test_open_requests_are_indexed_until_answered() -> None:
    """A request id is open while some carrier has no result."""
    c = cluster(devices=[device("a", status=request("r1", "vm", ["a"], EPOCH))])
    assert c.open_request_ids() == ["r1"]
    c.upsert_device(device("a", status=request("r1", "vm", ["a"], EPOCH, result="Failed")))
    assert c.open_request_ids() == []


def test_capacity_generation_moves_when_units_may_have_freed() -> None:
    """Freed units (device deleted or unbound) and node or class changes bump it; binding does not."""
    c = cluster(nodes=[node("n1", {A10: 2})], classes=[gpu_class("a10")])
    g0 = c.capacity_generation
    c.upsert_device(device("a", phase="Bound", node_name="n1"))
    assert c.capacity_generation == g0
    c.remove_device("t1", "a")
    g1 = c.capacity_generation
    assert g1 > g0
    c.upsert_node(node("n1", {A10: 4}))
    assert c.capacity_generation > g1


def test_dirty_nodes_name_every_node_a_change_touches() -> None:
    """A move marks the old and the new node for the accountant."""
    c = cluster(devices=[device("a", phase="Bound", node_name="n1")])
    c.dirty_nodes.clear()
    c.upsert_device(device("a", phase="Bound", node_name="n2"))
    assert c.dirty_nodes == {"n1", "n2"}


def test_namespaces_always_carry_their_name_label() -> None:
    """Selectors on kubernetes.io/metadata.name work even before the namespace's event arrives."""
    assert Cluster().namespace_labels("t9") == {"kubernetes.io/metadata.name": "t9"}


def test_arrival_order_tells_apart_devices_created_in_one_second() -> None:
    """Creation timestamps have one-second precision; first sight orders devices within a second (§5.5)."""
    c = cluster(devices=[device("zeta"), device("alpha")])
    assert c.arrival("t1", "zeta") < c.arrival("t1", "alpha")


def test_a_write_echo_arriving_after_the_deletion_does_not_bring_a_device_back() -> None:
    """Our own write's response can land after the DELETED event; its older version must not revive a ghost."""
    c = cluster(nodes=[node("n1", {A10: 1})], classes=[gpu_class("a10")])
    echo = device("a", phase="Bound", node_name="n1")
    echo["metadata"]["resourceVersion"] = "30"
    c.remove_device("t1", "a", resource_version="31")
    assert c.upsert_device(echo) is None
    assert c.device("t1", "a") is None
    assert list(c.devices_on("n1")) == []


def test_a_device_created_again_under_the_same_name_is_stored() -> None:
    """A later object of the name carries a newer resourceVersion than the removal: it is a new device."""
    c = Cluster()
    old = device("a")
    old["metadata"]["resourceVersion"] = "30"
    c.upsert_device(old)
    c.remove_device("t1", "a", resource_version="31")
    again = device("a", phase="Pending")
    again["metadata"]["resourceVersion"] = "40"
    assert c.upsert_device(again) is not None
    stored = c.device("t1", "a")
    assert stored is not None and stored.status.phase == "Pending"


def test_a_removal_without_a_version_buries_what_was_stored() -> None:
    """A 404 on our write removes the device; an echo no newer than what the view had stays out."""
    c = Cluster()
    seen = device("a")
    seen["metadata"]["resourceVersion"] = "50"
    c.upsert_device(seen)
    c.remove_device("t1", "a")
    echo = device("a", phase="Bound", node_name="n1")
    echo["metadata"]["resourceVersion"] = "50"
    assert c.upsert_device(echo) is None


def test_classes_budgets_and_gpunodes_are_not_revived_by_late_echoes() -> None:
    """The accountant and collector write status and finalizers on these too; the same rule holds."""
    c = Cluster()
    cls = gpu_class("a10")
    cls["metadata"]["resourceVersion"] = "7"
    c.remove_class("a10", resource_version="8")
    c.upsert_class(cls)
    assert "a10" not in c.classes
    b = budget("cap")
    b["metadata"]["resourceVersion"] = "7"
    c.remove_budget("t1", "cap", resource_version="8")
    c.upsert_budget(b)
    assert ("t1", "cap") not in c.budgets
    gn = {"metadata": {"name": "n1", "resourceVersion": "7"}}
    c.remove_gpunode("n1", resource_version="8")
    c.upsert_gpunode(gn)
    assert "n1" not in c.gpunodes


def test_tombstones_are_bounded() -> None:
    """Only recent removals are remembered: echoes arrive within moments, memory stays flat."""
    c = Cluster(tombstones=3)
    for i in range(5):
        c.remove_device("t1", f"d{i}", resource_version=str(100 + i))
    late = device("d0")
    late["metadata"]["resourceVersion"] = "1"
    assert c.upsert_device(late) is not None  # forgotten: the oldest removal fell out
    buried = device("d4")
    buried["metadata"]["resourceVersion"] = "1"
    assert c.upsert_device(buried) is None
