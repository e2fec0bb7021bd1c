"""The binder's waiting room (§5.5, §5.6): what waits, in which order, and what turned Lost."""

from __future__ import annotations

from cozygpu.api import GPUDevice, kinds
from cozygpu.decisions.waiting import in_turn, lost, overtakes
from cozygpu.runtime.view import View
from tests.support.views import A10, EPOCH, cluster, device, gpu_class, node, request


def _dev(*args: object, **kwargs: object) -> GPUDevice:
    return GPUDevice.from_wire(device(*args, **kwargs))  # type: ignore[arg-type]


def test_a_pending_held_device_waits_for_a_node() -> None:
    """§5.5: a held device with no request is the binder's to place."""
    assert _dev("a", phase="Pending").awaits_node
    assert _dev("a").awaits_node


def test_a_device_in_an_open_request_is_answered_as_a_set_not_placed_alone() -> None:
    """§4: while a request is open its devices wait for the answer, not for a node of their own."""
    assert not _dev("a", status=request("r1", "vm", ["a"], EPOCH)).awaits_node
    assert _dev("a", phase="Pending", status=request("r1", "vm", ["a"], EPOCH, result="Failed")).awaits_node


def test_a_new_template_device_belongs_to_its_admission() -> None:
    """A template device the webhook just created is placed by its VMI's request, never ahead of it."""
    assert not _dev("vm-gpu-0", template=True).awaits_node
    assert _dev("vm-gpu-0", template=True, phase="Pending").awaits_node


def test_a_lost_device_still_attached_waits_for_its_vmi_to_go() -> None:
    """§2: a Lost device attached to a VMI is not moved under it."""
    attached = {"attachedTo": {"vmi": "vm", "since": EPOCH.isoformat()}}
    assert not _dev("a", phase="Lost", status=attached).awaits_node
    assert _dev("a", phase="Lost").awaits_node


def test_a_device_being_deleted_is_not_placed() -> None:
    """Nothing is bound for a device on its way out."""
    body = device("a", phase="Pending")
    body["metadata"]["deletionTimestamp"] = EPOCH.isoformat()
    assert not GPUDevice.from_wire(body).awaits_node


def test_first_come_first_served_by_creation_then_first_sight_then_name() -> None:
    """§5.5: the oldest first; within one second of creation, the one the view saw first."""
    c = cluster(devices=[device("late", created=5), device("zeta", created=1), device("alpha", created=1)])
    ordered = in_turn(c, list(c.devices.values()))
    assert [d.name for d in in_turn(c)] == [d.name for d in ordered]
    assert [d.name for d in ordered] == ["zeta", "alpha", "late"]


def test_only_placeable_devices_are_in_turn() -> None:
    """The order holds only devices that may be placed on their own."""
    c = cluster(devices=[device("a"), device("vm-gpu-0", template=True)])
    assert [d.name for d in in_turn(c, list(c.devices.values()))] == ["a"] == [d.name for d in in_turn(c)]


def test_devices_bound_to_a_node_that_is_gone_are_lost_and_no_others() -> None:
    """§5.6: Bound on a deleted node: Lost; Bound on a live node, or already Lost, stays as it is."""
    c = cluster(
        nodes=[node("n1", {A10: 2}), node("n2", {A10: 2})],
        classes=[gpu_class("a10")],
        devices=[
            device("on-n1", phase="Bound", node_name="n1"),
            device("on-n2", phase="Bound", node_name="n2"),
            device("was-lost", phase="Lost", node_name="n2"),
        ],
    )
    assert list(lost(c)) == []
    View(c).forget(kinds.NODE, "", "n2")
    assert [(d.name, n) for d, n in lost(c)] == [("on-n2", "n2")]
    View(c).apply(kinds.NODE, node("n2", {A10: 2}))
    assert list(lost(c)) == []


def test_room_that_appears_mid_pass_goes_to_the_oldest_device_that_fits() -> None:
    """§5.5: with two units freed, the older two-unit device overtakes a younger one-unit one of its class;
    with one unit free only the younger fits, and nothing older stands in its way."""
    held = [device(f"h{i}", phase="Bound", node_name="n1") for i in range(2)]
    c = cluster(
        nodes=[node("n1", {A10: 2})],
        classes=[gpu_class("a10")],
        devices=[*held, device("old", count=2, created=1), device("young", created=2)],
    )
    old, young = c.devices.get(("t1", "old")), c.devices.get(("t1", "young"))
    assert old is not None and young is not None
    assert not overtakes(c, young) and not overtakes(c, old)  # nothing fits: nothing to give first
    View(c).forget(kinds.GPU_DEVICE, "t1", "h0")
    assert not overtakes(c, young)  # one unit: the older one does not fit it
    View(c).forget(kinds.GPU_DEVICE, "t1", "h1")
    assert overtakes(c, young) and not overtakes(c, old)
