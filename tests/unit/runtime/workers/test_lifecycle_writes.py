"""What each of the collector's actions (§6) writes on a device or class, built by decisions.lifecycle."""

from __future__ import annotations

from typing import Any

import pytest

from cozygpu.api import GPUDevice
from cozygpu.api.names import FINALIZER_IN_USE, KUBEVIRT_API_VERSION
from cozygpu.decisions.lifecycle import Action, Do, metadata_changes, metadata_changes_of, protected, runs, status_after
from tests.support.views import EPOCH, device, request

OTHER = "example.com/keep-me"


def in_use(**kw: Any) -> GPUDevice:
    """A Bound device attached to VMI vm with an open request, protected, with a condition to keep."""
    status = {
        **request("r1", "vm", ["d"], EPOCH),
        "message": "why",
        "conditions": [
            {
                "type": "Placed",
                "status": "True",
                "reason": "Bound",
                "message": "",
                "lastTransitionTime": EPOCH.isoformat(),
            }
        ],
    }
    body = device("d", phase="Bound", node_name="n1", status=status, **kw)
    body["metadata"]["finalizers"] = [OTHER, FINALIZER_IN_USE]
    return GPUDevice.from_wire(body)


def test_a_release_clears_the_attachment_and_its_request_and_keeps_the_units() -> None:
    """§6.2, §2: a detached device is free for another VMI but still Bound on its node, its conditions kept."""
    device = in_use()
    released = status_after(device, Action(Do.DETACH, "VMI vm is gone"))
    assert released.attached_to is None and released.bind_request is None
    assert (released.phase, released.node_name, released.message) == ("Bound", "n1", "why")
    assert released.conditions == device.status.conditions


def test_a_stale_request_is_cleared_and_the_attachment_kept() -> None:
    """§4: an unanswered request past the grace period goes; the attachment is the collector's to judge apart."""
    cleared = status_after(in_use(), Action(Do.CLEAR_REQUEST, "the bind request went unanswered"))
    assert cleared.bind_request is None
    assert cleared.attached_to is not None and cleared.attached_to.vmi == "vm"


def test_recording_the_vmi_sets_the_uid_and_keeps_the_attachment_as_it_was() -> None:
    """§6.1: the VMI's uid goes on the attachment; its name and since stay."""
    recorded = status_after(in_use(), Action(Do.RECORD_UID, "VMI vm exists", "u1"))
    assert recorded.attached_to is not None
    assert (recorded.attached_to.vmi, recorded.attached_to.uid, recorded.attached_to.since) == ("vm", "u1", EPOCH)
    assert recorded.bind_request is not None


def test_the_vmi_becomes_owner_next_to_the_owners_there_are() -> None:
    """§6.1, §1.2: an ownerReference of kind VirtualMachineInstance, with the attachment's VMI name and the uid."""
    changes = metadata_changes(in_use(template=True), Action(Do.OWN, "VMI vm owns it", "u1"))
    owners = changes["owner_references"]
    assert [(o.api_version, o.kind, o.name, o.uid) for o in owners] == [
        (KUBEVIRT_API_VERSION, "VirtualMachineInstance", "vm", "u1")
    ]
    assert set(changes) == {"owner_references"}


def test_the_in_use_finalizer_goes_on_and_off_leaving_the_others() -> None:
    """§6.5: only the operator's own finalizer changes; a device the collector deletes loses it first."""
    device = in_use()
    assert metadata_changes(device, Action(Do.REMOVE_FINALIZER)) == {"finalizers": [OTHER]}
    assert metadata_changes(device, Action(Do.DELETE, "its VMI is gone")) == {"finalizers": [OTHER]}
    bare = device.model_copy(update={"metadata": device.metadata.model_copy(update={"finalizers": [OTHER]})})
    assert metadata_changes(bare, Action(Do.ADD_FINALIZER)) == {"finalizers": [OTHER, FINALIZER_IN_USE]}


def test_protection_is_added_once_and_removed_entirely() -> None:
    """§6.5: on or off whatever the finalizers held before; a class's protection uses the same rule."""
    assert protected([FINALIZER_IN_USE, OTHER], protect=True) == [OTHER, FINALIZER_IN_USE]
    assert protected([FINALIZER_IN_USE, OTHER, FINALIZER_IN_USE], protect=False) == [OTHER]
    assert protected([], protect=True) == [FINALIZER_IN_USE]


def test_a_status_action_has_no_metadata_to_write() -> None:
    """The collector writes DETACH, CLEAR_REQUEST and RECORD_UID to the status subresource only."""
    with pytest.raises(ValueError, match="writes the status"):
        metadata_changes(in_use(), Action(Do.DETACH))


def test_a_run_of_metadata_actions_is_one_write_and_status_actions_stay_apart() -> None:
    """Consecutive metadata actions share one write, each built on the one before; a status action or a delete
    is a write of its own, in the order decided."""
    own, protect = Action(Do.OWN, "VMI vm owns it", "u1"), Action(Do.ADD_FINALIZER, "in use")
    record, delete = Action(Do.RECORD_UID, "VMI vm exists", "u1"), Action(Do.DELETE, "gone")
    assert runs([record, own, protect]) == [[record], [own, protect]]
    assert runs([own, record, protect]) == [[own], [record], [protect]]
    assert runs([Action(Do.REMOVE_FINALIZER, "x"), delete]) == [[Action(Do.REMOVE_FINALIZER, "x")], [delete]]
    changes = metadata_changes_of(in_use(template=True), [own, protect])
    assert set(changes) == {"owner_references", "finalizers"}
    assert changes["finalizers"][-1] == FINALIZER_IN_USE
    assert [o.uid for o in changes["owner_references"]] == ["u1"]
