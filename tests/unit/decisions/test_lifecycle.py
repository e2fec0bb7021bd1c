"""§6 decisions: what a device needs as its VMI appears, goes, or never comes."""

from __future__ import annotations

import datetime as dt
from typing import Any

from cozygpu.api import GPUClass, GPUDevice, kinds
from cozygpu.api.names import ANNOTATION_DEVICES, FINALIZER_IN_USE, LABEL_DEVICE_REFERENCE, TRUE
from cozygpu.decisions.lifecycle import Action, Do, class_action, device_actions, due
from cozygpu.runtime.view import View
from cozygpu.state.cluster import Cluster
from tests.support.views import EPOCH, cluster, device, gpu_class, pod

GRACE = dt.timedelta(minutes=2)
SOON = EPOCH + dt.timedelta(seconds=10)
LATE = EPOCH + dt.timedelta(minutes=5)


def attached(vmi: str = "vm", uid: str | None = None, **kw: Any) -> dict[str, Any]:
    a: dict[str, Any] = {"vmi": vmi, "since": EPOCH.isoformat()}
    if uid:
        a["uid"] = uid
    return device("d", phase="Bound", node_name="n1", status={"attachedTo": a}, **kw)


def with_vmi(
    uid: str | None, names: str = '[{"deviceTemplate": {"className": "a", "count": 1}}, {"device": "d"}]'
) -> Cluster:
    """A view with VMI `vm` of this uid, naming template device `vm-gpu-0` and held device `d` by default."""
    c = cluster()
    if uid:
        annotations = {ANNOTATION_DEVICES: names}
        View(c).apply(
            kinds.VMI,
            {
                "metadata": {
                    "name": "vm",
                    "namespace": "t1",
                    "uid": uid,
                    "annotations": annotations,
                    "labels": {LABEL_DEVICE_REFERENCE: TRUE},
                }
            },
        )
    return c


def dos(actions: list[Action]) -> list[Do]:
    return [a.do for a in actions]


def test_a_vmi_that_appears_is_recorded_and_protects_its_device() -> None:
    """§6.1/§6.5: its uid goes on the attachment and the in-use finalizer on the device."""
    actions = device_actions(with_vmi("u1"), GPUDevice.from_wire(attached()), SOON, GRACE)
    assert dos(actions) == [Do.RECORD_UID, Do.ADD_FINALIZER]
    assert actions[0].uid == "u1"


def test_a_template_device_gets_its_vmi_as_owner() -> None:
    """§6.1: a template device of the VMI, named after it, is owned by it."""
    body = attached(template=True)
    body["metadata"]["name"] = "vm-gpu-0"
    actions = device_actions(with_vmi("u1"), GPUDevice.from_wire(body), SOON, GRACE)
    assert Do.OWN in dos(actions)


def test_a_deleted_vmi_detaches_held_and_deletes_template_devices() -> None:
    """§6.2: matched by uid; a new VMI of the same name (another uid) does not keep them."""
    held = attached(uid="u1")
    held["metadata"]["finalizers"] = [FINALIZER_IN_USE]
    assert dos(device_actions(with_vmi(None), GPUDevice.from_wire(held), SOON, GRACE)) == [
        Do.DETACH,
        Do.REMOVE_FINALIZER,
    ]
    assert dos(device_actions(with_vmi("u2"), GPUDevice.from_wire(held), SOON, GRACE)) == [
        Do.DETACH,
        Do.REMOVE_FINALIZER,
    ]
    template = attached(uid="u1", template=True)
    assert dos(device_actions(with_vmi(None), GPUDevice.from_wire(template), SOON, GRACE)) == [Do.DELETE]


def launcher(uid: str, *, phase: str = "Running") -> dict[str, Any]:
    """The launcher pod of VMI `vm` with this uid, holding one unit on n1."""
    body = pod("virt-launcher-vm-x", vmi="vm", phase=phase)
    body["metadata"]["ownerReferences"][0]["uid"] = uid
    return body


def test_a_set_stays_while_its_guest_still_runs_in_a_launcher_pod() -> None:
    """§6.7: the VMI gone (its finalizers stripped, say) while its launcher pod still runs the guest: the held
    device stays attached and protected, the template device stays; once the pod ends, both are released, and
    the collector hears of it from the pod's change."""
    held = attached(uid="u1")
    held["metadata"]["finalizers"] = [FINALIZER_IN_USE]
    template = attached(uid="u1", template=True)
    c = with_vmi(None)
    View(c).apply(kinds.POD, launcher("u1"))
    assert dos(device_actions(c, GPUDevice.from_wire(held), SOON, GRACE)) == []
    assert dos(device_actions(c, GPUDevice.from_wire(template), SOON, GRACE)) == [Do.ADD_FINALIZER]
    ended = View(c).apply(kinds.POD, launcher("u1", phase="Succeeded"))
    assert ended.guests_gone == {("t1", "vm")}
    assert dos(device_actions(c, GPUDevice.from_wire(held), SOON, GRACE)) == [Do.DETACH, Do.REMOVE_FINALIZER]
    assert dos(device_actions(c, GPUDevice.from_wire(template), SOON, GRACE)) == [Do.DELETE]


def test_another_vmis_launcher_keeps_nothing() -> None:
    """§6.7 by uid: a launcher of another VMI of the name (a restart's new one) is not the gone VMI's guest."""
    c = with_vmi("u2")
    View(c).apply(kinds.POD, launcher("u2"))
    assert Do.DETACH in dos(device_actions(c, GPUDevice.from_wire(attached(uid="u1")), SOON, GRACE))


def test_an_attachment_whose_vmi_never_came_is_cleared_after_the_grace_period() -> None:
    """§6.3: within the grace period it waits (the VMI may be on its way); after, it goes."""
    body = GPUDevice.from_wire(attached())
    assert device_actions(with_vmi(None), body, SOON, GRACE) == []
    assert dos(device_actions(with_vmi(None), body, LATE, GRACE)) == [Do.DETACH]
    template = GPUDevice.from_wire(attached(template=True))
    assert dos(device_actions(with_vmi(None), template, LATE, GRACE)) == [Do.DELETE]


def test_a_stale_unanswered_request_is_cleared() -> None:
    """§4: a request without a result older than the grace period is stale."""
    r = {"bindRequest": {"id": "r", "vmi": "vm", "devices": ["d"], "requestedAt": EPOCH.isoformat()}}
    body = GPUDevice.from_wire(device("d", status=r))
    assert device_actions(cluster(), body, SOON, GRACE) == []
    assert dos(device_actions(cluster(), body, LATE, GRACE)) == [Do.CLEAR_REQUEST]


def test_an_orphan_template_device_is_deleted_after_the_grace_period() -> None:
    """§6.3: no owner and attached to no VMI: deleted once the grace period has passed since creation."""
    body = GPUDevice.from_wire(device("vm-gpu-0", template=True))
    assert device_actions(cluster(), body, SOON, GRACE) == []
    assert dos(device_actions(cluster(), body, LATE, GRACE)) == [Do.DELETE]
    assert due(body, GRACE, SOON) == EPOCH + GRACE


def test_a_device_made_with_its_finalizer_keeps_it_while_its_vmi_may_yet_appear() -> None:
    """§6.5 (issue 37 item 8): a VM's template device is made with the in-use finalizer; attached to a VMI not
    stored yet, within the grace period, the finalizer stays (no write to take it off and put it back); the VMI
    stored, only its uid is recorded; never stored, the device is deleted after the grace period as before."""
    body = attached(template=True)
    body["metadata"]["name"] = "vm-gpu-0"
    body["metadata"]["finalizers"] = [FINALIZER_IN_USE]
    body["metadata"]["ownerReferences"] = [
        {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": "vm", "uid": "u-vm"}
    ]
    made = GPUDevice.from_wire(body)
    assert device_actions(with_vmi(None), made, SOON, GRACE) == []
    assert dos(device_actions(with_vmi("u1"), made, SOON, GRACE)) == [Do.RECORD_UID]
    assert dos(device_actions(with_vmi(None), made, LATE, GRACE)) == [Do.DELETE]


def test_a_vms_template_device_just_made_is_left_to_its_admission_until_the_grace_period() -> None:
    """A VM's template device made by an admission (owner and finalizer from its create, issue 37 item 8), its
    request not written yet: nothing is asked of the VM, nothing kept, nothing written, so no write of the
    collector's races the admission's; past the grace period with nothing attached, it is deleted (§6.3). Before,
    it was taken for a restart's admission undone and the VM was read and the device marked kept."""
    body = device("vm-gpu-0", template=True)
    body["metadata"]["finalizers"] = [FINALIZER_IN_USE]
    body["metadata"]["ownerReferences"] = [
        {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": "vm", "uid": "u-vm"}
    ]
    made = GPUDevice.from_wire(body)
    assert device_actions(cluster(), made, SOON, GRACE) == []
    assert dos(device_actions(cluster(), made, LATE, GRACE)) == [Do.DELETE]
    assert due(made, GRACE, SOON) == EPOCH + GRACE


def test_a_finalizer_without_a_live_vmi_is_removed() -> None:
    """§6.5: the finalizer is there exactly while a VMI that exists uses the device."""
    body = device("d", phase="Bound", node_name="n1")
    body["metadata"]["finalizers"] = [FINALIZER_IN_USE, "other/keep"]
    assert dos(device_actions(cluster(), GPUDevice.from_wire(body), SOON, GRACE)) == [Do.REMOVE_FINALIZER]


def test_an_attached_and_recorded_device_needs_nothing() -> None:
    """Steady state: attached to a live VMI by uid, finalizer in place."""
    body = attached(uid="u1")
    body["metadata"]["finalizers"] = [FINALIZER_IN_USE]
    assert device_actions(with_vmi("u1"), GPUDevice.from_wire(body), LATE, GRACE) == []


def test_a_class_keeps_its_finalizer_until_no_device_names_it() -> None:
    """§6.5: added to every class; removed once the class is being deleted and unused."""
    assert class_action(cluster(), GPUClass.from_wire(gpu_class("a10"))) is Do.ADD_FINALIZER
    deleting = gpu_class("a10")
    deleting["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z", finalizers=[FINALIZER_IN_USE])
    used = cluster(devices=[device("d", "a10")])
    assert class_action(used, GPUClass.from_wire(deleting)) is None
    assert class_action(cluster(), GPUClass.from_wire(deleting)) is Do.REMOVE_FINALIZER


def test_a_vmi_of_the_name_that_does_not_name_the_device_is_not_recorded_on_it() -> None:
    """§14.2: two creates of one name race; the one refused AlreadyExists attached `d`, which the VMI that exists
    does not reference: its uid is not recorded and, past the grace period, the device is let go."""
    view = with_vmi("u1", names='[{"device": "other"}]')
    held = GPUDevice.from_wire(attached())
    assert device_actions(view, held, SOON, GRACE) == []
    late = device_actions(view, held, LATE, GRACE)
    assert dos(late) == [Do.DETACH] and "does not reference it" in late[0].reason
    template = attached(template=True)
    template["metadata"]["name"] = "vm-gpu-0"
    assert dos(device_actions(view, GPUDevice.from_wire(template), SOON, GRACE)) == []
    assert dos(device_actions(view, GPUDevice.from_wire(template), LATE, GRACE)) == [Do.DELETE]
