"""The webhook's side of the bind protocol (§4): when it may attach a device, what it writes, when the answer is
in."""

from __future__ import annotations

import datetime as dt
from typing import Any

from cozygpu.api import BindRequest, GPUDevice
from cozygpu.decisions import attach
from cozygpu.runtime.view import View
from tests.support.views import EPOCH, cluster, device, request

NOW = EPOCH + dt.timedelta(seconds=30)
ASK = BindRequest(id="r1", vmi="vm", devices=["a", "b"], requested_at=NOW)


def bound(name: str = "a", attached: dict[str, Any] | None = None, **kw: Any) -> GPUDevice:
    status = {"attachedTo": attached} if attached is not None else {}
    return GPUDevice.from_wire(device(name, phase="Bound", node_name="n1", status=status, **kw))


def test_a_device_gone_deleting_or_attached_elsewhere_is_refused_at_the_write() -> None:
    """§3: what changed between the check and the write is a refusal naming the device and why."""
    deleting = bound()
    deleting.metadata.deletion_timestamp = EPOCH
    assert attach.refusal(None, "a", "vm") == "GPUDevice a no longer exists"
    assert attach.refusal(deleting, "a", "vm") == "GPUDevice a (node n1) is being deleted"
    assert (
        attach.refusal(bound(attached={"vmi": "other"}), "a", "vm") == "GPUDevice a (node n1) is attached to VMI other"
    )


def test_a_free_device_or_one_attached_to_this_vmi_may_be_attached() -> None:
    """§4: `attachedTo` is written if not already attached to this VMI; attached to it already is no refusal."""
    assert attach.refusal(bound(), "a", "vm") is None
    assert attach.refusal(bound(attached={"vmi": "vm"}), "a", "vm") is None
    assert attach.refusal(bound(attached={"vmi": "vm", "uid": "u0"}), "a", "vm") is None


def test_a_free_device_is_attached_with_the_request_in_one_update() -> None:
    """§4: one status update carries the attachment (since now, no uid yet) and the request; the rest is kept."""
    step = attach.requested(bound(), "vm", ASK, NOW, earlier_gone=False)
    assert step.attaching
    status = step.device.status
    assert status.attached_to is not None
    assert (status.attached_to.vmi, status.attached_to.uid, status.attached_to.since) == ("vm", None, NOW)
    assert status.bind_request == ASK
    assert (status.phase, status.node_name) == ("Bound", "n1")


def test_an_attachment_this_name_already_has_is_kept_and_not_this_calls_to_undo() -> None:
    """§3, §4: an attachment to the VMI's name another call made stays as it was; the undo leaves it."""
    earlier = {"vmi": "vm", "since": EPOCH.isoformat()}
    step = attach.requested(bound(attached=earlier), "vm", ASK, NOW, earlier_gone=True)
    assert not step.attaching
    assert step.device.status.attached_to is not None and step.device.status.attached_to.since == EPOCH
    assert step.device.status.bind_request == ASK


def test_an_earlier_vmi_objects_attachment_becomes_this_calls_only_once_that_vmi_is_gone() -> None:
    """§6.2: a uid on the attachment is an earlier VMI of the name; while it exists the attachment stays its."""
    device = bound(attached={"vmi": "vm", "uid": "u0", "since": EPOCH.isoformat()})
    assert attach.earlier_vmi(device) == "u0"
    kept = attach.requested(device, "vm", ASK, NOW, earlier_gone=False)
    assert not kept.attaching and kept.device.status.attached_to is not None
    assert kept.device.status.attached_to.uid == "u0"
    taken = attach.requested(device, "vm", ASK, NOW, earlier_gone=True)
    assert taken.attaching and taken.device.status.attached_to is not None
    assert (taken.device.status.attached_to.uid, taken.device.status.attached_to.since) == (None, NOW)


def test_no_earlier_vmi_is_asked_about_without_a_claimed_attachment() -> None:
    """Only a uid recorded on the attachment names an earlier VMI object; the API is not asked otherwise."""
    assert attach.earlier_vmi(bound()) is None
    assert attach.earlier_vmi(bound(attached={"vmi": "vm"})) is None


def carrying(name: str, request_id: str = "r1", result: str | None = "Succeeded") -> dict[str, Any]:
    return device(name, phase="Bound", node_name="n1", status=request(request_id, "vm", ["a", "b"], NOW, result))


def test_the_set_is_answered_once_every_device_carries_the_binders_result() -> None:
    """§4: the answer is in when each named device carries this request with a result: one node, Bound."""
    assert attach.verdict(cluster(devices=[carrying("b"), carrying("a")]), "t1", ASK) == attach.Bound("n1")


def test_an_open_missing_or_foreign_request_is_not_yet_an_answer() -> None:
    """§4: one device still open, gone, or carrying another request keeps the admission waiting."""
    waiting = attach.Waiting()
    assert attach.verdict(cluster(devices=[carrying("a"), carrying("b", result=None)]), "t1", ASK) == waiting
    assert attach.verdict(cluster(devices=[carrying("a")]), "t1", ASK) == waiting
    assert attach.verdict(cluster(devices=[carrying("a"), carrying("b", "r2")]), "t1", ASK) == waiting


def test_a_failed_answer_or_one_that_does_not_hold_together_is_refused_with_the_binders_words() -> None:
    """§4: a Failed result carries the binder's message; devices answered Succeeded on two nodes, or with no node,
    are refused as such, never admitted."""
    failed = request("r1", "vm", ["a", "b"], NOW, "Failed")
    failed["bindRequest"]["message"] = "no node has 2 free units"
    c = cluster(devices=[device("a", status=failed), device("b", status=failed)])
    assert attach.verdict(c, "t1", ASK) == attach.Refused("no node has 2 free units")
    apart = cluster(
        devices=[
            carrying("a"),
            device("b", phase="Bound", node_name="n2", status=request("r1", "vm", ["a", "b"], NOW, "Succeeded")),
        ]
    )
    assert attach.verdict(apart, "t1", ASK) == attach.Refused(
        "the GPU binder placed the set on more than one node: n1, n2"
    )


def test_an_answer_the_binder_only_assumed_is_not_one_yet() -> None:
    """§13.1: the binder's write of an assumed answer may still lose; the admission waits for it to land."""
    c = cluster(devices=[carrying("a"), carrying("b", result=None)])
    b = c.devices.get(("t1", "b"))
    assert b is not None and b.status.bind_request is not None
    answer = b.status.model_copy(
        update={"bind_request": b.status.bind_request.model_copy(update={"result": "Succeeded"})}
    )
    View(c).assume(b.model_copy(update={"status": answer}))
    assert attach.verdict(c, "t1", ASK) == attach.Waiting()
