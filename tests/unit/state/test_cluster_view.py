"""The in-memory view: newest version wins, indexes follow, capacity changes are noticed."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cozygpu.api import kinds
from cozygpu.api.kubevirt import KubeVirtConfig
from cozygpu.api.names import LABEL_DEVICE_REFERENCE, TRUE
from cozygpu.runtime.view import View
from cozygpu.state.cluster import KINDS, Cluster
from tests.support.views import A10, EPOCH, L40S, budget, cluster, device, gpu_class, node, pod, request


def test_an_older_event_does_not_overwrite_a_newer_write() -> None:
    """The binder's own write (newer resourceVersion) is kept when a stale event arrives after it."""
    c = Cluster()
    newer = device("a", phase="Bound", node_name="n1")
    newer["metadata"]["resourceVersion"] = "20"
    older = device("a")
    older["metadata"]["resourceVersion"] = "10"
    View(c).apply(kinds.GPU_DEVICE, newer)
    View(c).apply(kinds.GPU_DEVICE, older)
    stored = c.devices.get(("t1", "a"))
    assert stored is not None and stored.status.node_name == "n1"


def test_indexes_follow_a_device_that_moves() -> None:
    """devices_on and the namespace index reflect the current node only."""
    c = cluster(devices=[device("a", phase="Bound", node_name="n1")])
    moved = device("a", phase="Bound", node_name="n2")
    View(c).apply(kinds.GPU_DEVICE, moved)
    assert [d.name for d in c.devices.on("n2")] == ["a"]
    assert list(c.devices.on("n1")) == []
    assert [d.name for d in c.devices.in_namespace("t1")] == ["a"]


def test_open_requests_are_indexed_until_answered() -> None:
    """A request id is open while some carrier has no result."""
    c = cluster(devices=[device("a", status=request("r1", "vm", ["a"], EPOCH))])
    assert c.devices.open_request_ids() == ["r1"]
    View(c).apply(kinds.GPU_DEVICE, device("a", status=request("r1", "vm", ["a"], EPOCH, result="Failed")))
    assert c.devices.open_request_ids() == []


def test_room_is_named_only_where_units_were_freed_and_serving_where_a_node_started_serving() -> None:
    """§5.5, §14.3: a Bound device deleted frees room for the classes its node serves; a waiting device
    deleted or a bind frees none; a new node is room for the classes it serves (and, the first with their
    resource, a reason read anew), a node that serves nothing names none."""
    c = cluster(nodes=[node("n1", {A10: 2})], classes=[gpu_class("a10"), gpu_class("l40s", L40S)])
    assert View(c).apply(kinds.GPU_DEVICE, device("a", phase="Bound", node_name="n1")).room == frozenset()
    assert View(c).apply(kinds.GPU_DEVICE, device("w", phase="Pending")).room == frozenset()
    assert View(c).apply(kinds.GPU_DEVICE, device("w", phase="Pending"), deleted=True).room == frozenset()
    assert View(c).apply(kinds.GPU_DEVICE, device("a", phase="Bound", node_name="n1"), deleted=True).room == {"a10"}
    added = View(c).apply(kinds.NODE, node("n2", {L40S: 4}))
    assert (added.room, added.served) == ({"l40s"}, {"l40s"})
    down = View(c).apply(kinds.NODE, node("n3", {A10: 1}, ready=False))
    assert (down.room, down.served) == (frozenset(), frozenset())


def test_a_change_names_every_node_it_touches() -> None:
    """A move names the old and the new node (for the accountant), and the device's namespace."""
    c = cluster(devices=[device("a", phase="Bound", node_name="n1")])
    change = View(c).apply(kinds.GPU_DEVICE, device("a", phase="Bound", node_name="n2"))
    assert change.stored and change.nodes == {"n1", "n2"} and change.namespaces == {"t1"}


def test_a_change_the_view_ignores_says_so_and_touches_nothing() -> None:
    """An event older than what is stored is not a change: no worker is told of it."""
    c = Cluster()
    newer, older = device("a", phase="Bound", node_name="n1"), device("a", phase="Bound", node_name="n2")
    older["metadata"]["resourceVersion"] = "1"
    View(c).apply(kinds.GPU_DEVICE, newer)
    change = View(c).apply(kinds.GPU_DEVICE, older)
    assert not change.stored and not change.nodes and c.devices.get(("t1", "a")).status.node_name == "n1"


def test_a_deletion_is_a_change_of_what_the_object_touched() -> None:
    """A DELETED event names the node the device was Bound on; one for an unknown object changes nothing."""
    c = cluster(devices=[device("a", phase="Bound", node_name="n1")])
    gone = View(c).apply(kinds.GPU_DEVICE, {"metadata": {"namespace": "t1", "name": "a"}}, deleted=True)
    assert gone.deleted and gone.stored and gone.nodes == {"n1"}
    assert not View(c).apply(kinds.GPU_DEVICE, {"metadata": {"namespace": "t1", "name": "a"}}, deleted=True).stored


# Per kind the view holds: an object named x at any version, where its store keeps it, and whether it holds it.
STORES: dict[kinds.Kind, tuple[dict[str, Any], Any, Callable[[Cluster], bool]]] = {
    kinds.GPU_CLASS: (gpu_class("x"), "x", lambda c: "x" in c.classes),
    kinds.GPU_DEVICE: (device("x"), ("t1", "x"), lambda c: c.devices.get(("t1", "x")) is not None),
    kinds.GPU_BUDGET: (budget("x"), ("t1", "x"), lambda c: ("t1", "x") in c.budgets),
    kinds.GPU_NODE: ({"metadata": {"name": "x"}}, "x", lambda c: "x" in c.gpunodes),
    kinds.NODE: (node("x", {A10: 1}), "x", lambda c: "x" in c.capacity.nodes),
    kinds.NAMESPACE: ({"metadata": {"name": "x", "labels": {"team": "a"}}}, "x", lambda c: "x" in c.namespaces),
    kinds.KUBEVIRT: (
        {
            "metadata": {"name": "x", "namespace": "t1"},
            "spec": {"configuration": {"permittedHostDevices": {"pciHostDevices": [{"resourceName": A10}]}}},
        },
        ("t1", "x"),
        lambda c: ("t1", "x") in c.kubevirts,
    ),
    kinds.VMI: (
        {"metadata": {"name": "x", "namespace": "t1", "uid": "u-x"}},
        ("t1", "x"),
        lambda c: c.vmis.exists("u-x"),
    ),
    kinds.POD: (pod("x"), ("t1", "x"), lambda c: c.pods.get("t1", "x") is not None),
}


def _at(body: dict[str, Any], version: int) -> dict[str, Any]:
    return {**body, "metadata": {**body["metadata"], "resourceVersion": str(version)}}


def test_every_kind_the_view_holds_has_a_store_checked_below() -> None:
    """One kind table: each kind the watches and the resync apply to the view is one of the stores checked below."""
    assert set(KINDS) == set(STORES)


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_s_store_keeps_the_newest_forgets_a_deletion_and_ignores_stale_events(kind: kinds.Kind) -> None:
    """Per kind: an event is stored at its version, an older one is ignored, a newer one replaces it, a deletion
    forgets it, and the deleted object's late echo does not bring it back."""
    body, key, held = STORES[kind]
    c = cluster(nodes=[node("n1", {A10: 1})], classes=[gpu_class("a10")])
    assert not held(c) and c.stored_version(kind, key) is None
    assert View(c).apply(kind, _at(body, 5)).stored
    assert held(c) and c.stored_version(kind, key) == 5 and c.holds(kind, key, "5")
    assert not View(c).apply(kind, _at(body, 3)).stored
    assert held(c) and c.stored_version(kind, key) == 5
    View(c).apply(kind, _at(body, 7))
    assert held(c) and c.stored_version(kind, key) == 7
    gone = View(c).apply(kind, _at(body, 8), deleted=True)
    assert gone.deleted and gone.stored
    assert not held(c) and c.stored_version(kind, key) is None and not c.knows(kind, key)
    assert not View(c).apply(kind, _at(body, 7)).stored
    assert not held(c) and c.stored_version(kind, key) is None


def test_a_class_change_touches_every_node() -> None:
    """Any node may start or stop serving a changed class: the change says all nodes."""
    c = Cluster()
    assert View(c).apply(kinds.GPU_CLASS, gpu_class("a10", A10)).all_nodes


def test_namespaces_always_carry_their_name_label() -> None:
    """Selectors on kubernetes.io/metadata.name work even before the namespace's event arrives."""
    assert Cluster().namespace_labels("t9") == {"kubernetes.io/metadata.name": "t9"}


def test_arrival_order_tells_apart_devices_created_in_one_second() -> None:
    """Creation timestamps have one-second precision; first sight orders devices within a second (§5.5)."""
    c = cluster(devices=[device("zeta"), device("alpha")])
    assert c.devices.arrival("t1", "zeta") < c.devices.arrival("t1", "alpha")


def test_a_write_echo_arriving_after_the_deletion_does_not_bring_a_device_back() -> None:
    """Our own write's response can land after the DELETED event; its older version must not revive a ghost."""
    c = cluster(nodes=[node("n1", {A10: 1})], classes=[gpu_class("a10")])
    echo = device("a", phase="Bound", node_name="n1")
    echo["metadata"]["resourceVersion"] = "30"
    View(c).forget(kinds.GPU_DEVICE, "t1", "a", resource_version="31")
    assert not View(c).apply(kinds.GPU_DEVICE, echo).stored
    assert c.devices.get(("t1", "a")) is None
    assert list(c.devices.on("n1")) == []


def test_a_device_created_again_under_the_same_name_is_stored() -> None:
    """A later object of the name carries a newer resourceVersion than the removal: it is a new device."""
    c = Cluster()
    old = device("a")
    old["metadata"]["resourceVersion"] = "30"
    View(c).apply(kinds.GPU_DEVICE, old)
    View(c).forget(kinds.GPU_DEVICE, "t1", "a", resource_version="31")
    again = device("a", phase="Pending")
    again["metadata"]["resourceVersion"] = "40"
    assert View(c).apply(kinds.GPU_DEVICE, again).stored
    stored = c.devices.get(("t1", "a"))
    assert stored is not None and stored.status.phase == "Pending"


def test_a_removal_without_a_version_buries_what_was_stored() -> None:
    """A 404 on our write removes the device; an echo no newer than what the view had stays out."""
    c = Cluster()
    seen = device("a")
    seen["metadata"]["resourceVersion"] = "50"
    View(c).apply(kinds.GPU_DEVICE, seen)
    View(c).forget(kinds.GPU_DEVICE, "t1", "a")
    echo = device("a", phase="Bound", node_name="n1")
    echo["metadata"]["resourceVersion"] = "50"
    assert not View(c).apply(kinds.GPU_DEVICE, echo).stored


def test_classes_budgets_and_gpunodes_are_not_revived_by_late_echoes() -> None:
    """The accountant and collector write status and finalizers on these too; the same rule holds."""
    c = Cluster()
    cls = gpu_class("a10")
    cls["metadata"]["resourceVersion"] = "7"
    View(c).forget(kinds.GPU_CLASS, "", "a10", resource_version="8")
    View(c).apply(kinds.GPU_CLASS, cls)
    assert "a10" not in c.classes
    b = budget("cap")
    b["metadata"]["resourceVersion"] = "7"
    View(c).forget(kinds.GPU_BUDGET, "t1", "cap", resource_version="8")
    View(c).apply(kinds.GPU_BUDGET, b)
    assert ("t1", "cap") not in c.budgets
    gn = {"metadata": {"name": "n1", "resourceVersion": "7"}}
    View(c).forget(kinds.GPU_NODE, "", "n1", resource_version="8")
    View(c).apply(kinds.GPU_NODE, gn)
    assert "n1" not in c.gpunodes


def test_tombstones_are_bounded() -> None:
    """Only recent removals are remembered: echoes arrive within moments, memory stays flat."""
    c = Cluster(tombstones=3)
    for i in range(5):
        View(c).forget(kinds.GPU_DEVICE, "t1", f"d{i}", resource_version=str(100 + i))
    late = device("d0")
    late["metadata"]["resourceVersion"] = "1"
    assert View(c).apply(kinds.GPU_DEVICE, late).stored  # forgotten: the oldest removal fell out
    buried = device("d4")
    buried["metadata"]["resourceVersion"] = "1"
    assert not View(c).apply(kinds.GPU_DEVICE, buried).stored


def test_vmis_are_known_by_uid_and_a_new_one_of_the_name_replaces_the_old() -> None:
    """§6.2: the uid index answers 'does this VMI exist' without a scan; a re-created name drops the old uid."""
    c = Cluster()
    View(c).apply(kinds.VMI, {"metadata": {"namespace": "t1", "name": "vm", "uid": "u1"}})
    assert c.vmis.exists("u1")
    View(c).apply(kinds.VMI, {"metadata": {"namespace": "t1", "name": "vm", "uid": "u2"}})
    assert (c.vmis.exists("u1"), c.vmis.exists("u2")) == (False, True)
    View(c).forget(kinds.VMI, "t1", "vm")
    assert not c.vmis.exists("u2")
    assert not c.vmis.exists("")


_ops = st.lists(
    st.tuples(
        st.sampled_from(["bind", "unbind", "delete", "node", "node-gone"]),
        st.integers(0, 5),  # which device (or node)
        st.integers(0, 2),  # which node, or how many units a node gets
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(_ops)
def test_held_units_and_nodes_by_resource_always_match_a_recount(ops: list[tuple[str, int, int]]) -> None:
    """The incremental indexes (held units, nodes by resource, the most units a node has, nodes devices name
    that are gone, the waiting devices' order) equal what summing every device, scanning every node and
    sorting would give."""
    c = cluster(classes=[gpu_class("a10"), gpu_class("l40", L40S)])
    versions = iter(range(1000, 10_000))
    for op, i, j in ops:
        name, cls = f"d{i}", ("a10", "l40")[i % 2]
        body: dict[str, Any] | None = None
        if op == "bind":
            body = device(name, cls, 1 + i % 3, phase="Bound", node_name=f"n{j}")
        elif op == "unbind":
            body = device(name, cls, 1 + i % 3, phase="Pending")
        elif op == "delete":
            View(c).forget(kinds.GPU_DEVICE, "t1", name, resource_version=str(next(versions)))
        elif op == "node-gone":
            View(c).forget(kinds.NODE, "", f"n{i % 3}", resource_version=str(next(versions)))
        else:
            gpus = {A10: j} if i % 2 else {A10: j, L40S: 1}
            raw = node(f"n{i % 3}", gpus)
            raw["metadata"]["resourceVersion"] = str(next(versions))
            View(c).apply(kinds.NODE, raw)
        if body is not None:
            body["metadata"]["resourceVersion"] = str(next(versions))
            View(c).apply(kinds.GPU_DEVICE, body)
    recount: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for d in c.devices.values():
        if d.holds_gpus and d.status.node_name:
            recount[d.status.node_name][d.spec.class_name] += d.spec.count
    for n in {f"n{k}" for k in range(3)} | set(recount):
        assert c.devices.held_by_class(n) == dict(recount.get(n, {}))
    for resources in ({A10}, {L40S}, {A10, L40S}):
        assert c.capacity.nodes_with(resources) == sorted(
            n.name for n in c.capacity.nodes.values() if resources <= n.allocatable.keys()
        )
    for resource in (A10, L40S, "example.com/none"):
        assert c.capacity.most_units(resource) == max((n.units(resource) for n in c.capacity.nodes.values()), default=0)
    named = {d.status.node_name for d in c.devices.values() if d.status.node_name}
    assert c.gone_nodes() == sorted(n for n in named if n not in c.capacity.nodes)
    unbound = [d for d in c.devices.values() if not d.holds_gpus]
    assert c.devices.unbound_in_turn() == sorted(unbound, key=c.devices.turn)


def _vmi(name: str, uid: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "t1", "name": name, "uid": uid, "resourceVersion": rv}}


def test_a_resync_finds_what_a_list_lacks_at_an_older_version_only() -> None:
    """§6.4: stored at or before the list's version and not listed: removed unseen; newer: arrived after the list."""
    c = Cluster()
    for name, rv in (("gone", "10"), ("kept", "11"), ("late", "30")):
        d = device(name)
        d["metadata"]["resourceVersion"] = rv
        View(c).apply(kinds.GPU_DEVICE, d)
    assert c.missing(kinds.GPU_DEVICE, {("t1", "kept")}, "20") == [("t1", "gone")]
    View(c).apply(kinds.VMI, _vmi("vm", "u1", "5"))
    assert c.missing(kinds.VMI, set(), "20") == [("t1", "vm")]
    View(c).apply(kinds.NODE, node("n1", {A10: 1}))
    assert c.missing(kinds.NODE, set(), "0") == []


def test_an_older_vmi_event_or_list_never_replaces_a_newer_vmi() -> None:
    """A list taken before a VMI was re-created must not put the old uid back (§6.2: the uid is the VMI)."""
    c = Cluster()
    View(c).apply(kinds.VMI, _vmi("vm", "new-uid", "50"))
    View(c).apply(kinds.VMI, _vmi("vm", "old-uid", "40"))
    assert c.vmis[("t1", "vm")] == "new-uid"
    assert not c.vmis.exists("old-uid")


def test_a_removed_vmi_or_node_is_not_brought_back_by_a_list_taken_before() -> None:
    """The DELETED event came first; the older list that still shows the object must not revive it."""
    c = Cluster()
    View(c).apply(kinds.VMI, _vmi("vm", "u1", "5"))
    View(c).forget(kinds.VMI, "t1", "vm", resource_version="9")
    View(c).apply(kinds.VMI, _vmi("vm", "u1", "5"))
    assert ("t1", "vm") not in c.vmis
    old = node("n1", {A10: 1})
    old["metadata"]["resourceVersion"] = "5"
    View(c).forget(kinds.NODE, "", "n1", resource_version="9")
    assert not View(c).apply(kinds.NODE, old).stored
    assert "n1" not in c.capacity.nodes


def test_a_resync_can_tell_what_the_view_holds_at_that_very_version() -> None:
    """§6.4, §13.3: a listed object at the stored version is skipped unread; another version, or a new one, is not."""
    c = cluster(nodes=[node("n1", {A10: 1})], devices=[device("a")])
    stored = c.devices.get(("t1", "a"))
    assert stored is not None
    assert c.holds(kinds.GPU_DEVICE, ("t1", "a"), stored.metadata.resource_version)
    assert not c.holds(kinds.GPU_DEVICE, ("t1", "a"), "999999")
    assert not c.holds(kinds.GPU_DEVICE, ("t1", "b"), stored.metadata.resource_version)
    assert c.holds(kinds.NODE, "n1", c.capacity.nodes["n1"].resource_version)
    View(c).apply(kinds.NAMESPACE, {"metadata": {"name": "t1", "resourceVersion": "7"}})
    assert c.holds(kinds.NAMESPACE, "t1", "7") and not c.holds(kinds.NAMESPACE, "t1", "8")


def test_removing_a_kubevirt_without_a_host_device_table_is_a_change() -> None:
    """§1.5: a KubeVirt CR with no permittedHostDevices is held as 'no table'; its removal is news all the same."""
    c = Cluster()
    kv = {"metadata": {"name": "kubevirt", "namespace": "kubevirt", "resourceVersion": "3"}, "spec": {}}
    assert View(c).apply(kinds.KUBEVIRT, kv).stored
    assert c.kubevirts == {("kubevirt", "kubevirt"): KubeVirtConfig()}
    gone = View(c).apply(kinds.KUBEVIRT, {"metadata": {**kv["metadata"], "resourceVersion": "4"}}, deleted=True)
    assert gone.stored and c.kubevirts == {}


def test_a_node_with_a_thousand_units_is_read_as_the_api_server_writes_it() -> None:
    """The API server canonicalises 1000 units to "1k": the view counts them all, not none (found by a bench)."""
    body = node("n1", {A10: 2})
    body["status"]["allocatable"][A10] = "1k"
    c = cluster(nodes=[body], classes=[gpu_class("a10")])
    assert c.capacity.nodes["n1"].allocatable[A10] == 1000 and c.capacity.most_units(A10) == 1000


def _marked_vmi(name: str, off: str | None, version: int) -> dict[str, Any]:
    """A VMI with device references, marked for evacuation off `off` (None: not marked)."""
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {
            "name": name,
            "namespace": "t1",
            "uid": f"u-{name}",
            "resourceVersion": str(version),
            "labels": {LABEL_DEVICE_REFERENCE: TRUE},
        },
        "status": {"evacuationNodeName": off} if off else {},
    }


def test_evacuation_marks_are_read_per_node_the_first_marked_first() -> None:
    """§6.8: a node's marks come from an index by node, oldest first; a VMI marked again off another node leaves
    the first node's, and one unmarked or gone leaves both."""
    view = View(Cluster())
    for version, (name, off) in enumerate([("a", "n1"), ("b", "n2"), ("c", "n1")], start=1):
        view.apply(kinds.VMI, _marked_vmi(name, off, version))

    def marked_off(node: str | None) -> list[str]:
        return [key[1] for key, _ in view.cluster.vmis.marked(node)]

    assert (marked_off("n1"), marked_off("n2"), marked_off(None)) == (["a", "c"], ["b"], ["a", "b", "c"])
    view.apply(kinds.VMI, _marked_vmi("a", "n2", 4))
    assert (marked_off("n1"), marked_off("n2")) == (["c"], ["a", "b"])
    view.apply(kinds.VMI, _marked_vmi("c", None, 5))
    view.apply(kinds.VMI, _marked_vmi("b", "n2", 6), deleted=True)
    assert (marked_off("n1"), marked_off("n2"), marked_off(None)) == ([], ["a"], ["a"])
