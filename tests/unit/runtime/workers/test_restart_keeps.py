"""§6.6 decisions: a VM's restart keeps its template GPUs; a stop, a deletion or no new VMI lets them go."""

from __future__ import annotations

import datetime as dt
from typing import Any

from cozygpu.api import GPUDevice, kinds
from cozygpu.api.kubevirt import wants_to_run
from cozygpu.api.names import ANNOTATION_DEVICES, CONDITION_KEPT, FINALIZER_IN_USE, LABEL_DEVICE_REFERENCE, TRUE
from cozygpu.decisions.lifecycle import RECHECK, Action, Do, device_actions, due, metadata_changes, status_after
from cozygpu.runtime.view import View
from cozygpu.state.cluster import Cluster
from tests.support.views import EPOCH, cluster, device

GRACE = dt.timedelta(minutes=2)
SOON = EPOCH + dt.timedelta(seconds=10)
LATE = EPOCH + dt.timedelta(minutes=5)
VM_REF = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": "vm", "uid": "vm-uid"}


def template(
    *, owner: dict[str, Any] | None = VM_REF, uid: str | None = "u1", kept: dt.datetime | None = None
) -> GPUDevice:
    """Template device vm-gpu-0, Bound on n1, attached to VMI vm (claimed by `uid`), owned by `owner`."""
    attached: dict[str, Any] = {"vmi": "vm", "since": EPOCH.isoformat()}
    if uid:
        attached["uid"] = uid
    status: dict[str, Any] = {"attachedTo": attached}
    if kept is not None:
        status["conditions"] = [
            {
                "type": CONDITION_KEPT,
                "status": "True",
                "reason": "VirtualMachineRestarting",
                "lastTransitionTime": kept.isoformat(),
            }
        ]
    body = device("vm-gpu-0", phase="Bound", node_name="n1", template=True, status=status)
    body["metadata"]["finalizers"] = [FINALIZER_IN_USE]
    body["metadata"]["ownerReferences"] = [owner] if owner else []
    return GPUDevice.from_wire(body)


def vmi(uid: str | None, *, vm: bool = True) -> Cluster:
    """A view with VMI vm of this uid (none: no VMI), controlled by VM vm when `vm`."""
    c = cluster()
    if uid:
        meta: dict[str, Any] = {
            "name": "vm",
            "namespace": "t1",
            "uid": uid,
            "annotations": {ANNOTATION_DEVICES: '[{"deviceTemplate": {"className": "a", "count": 1}}]'},
            "labels": {LABEL_DEVICE_REFERENCE: TRUE},  # as every VMI the webhook admits
        }
        if vm:
            meta["ownerReferences"] = [{**VM_REF, "controller": True}]
        View(c).apply(kinds.VMI, {"metadata": meta})
    return c


def dos(actions: list[Action]) -> list[Do]:
    return [a.do for a in actions]


def test_a_template_device_of_a_vm_controlled_vmi_is_owned_by_the_vm() -> None:
    """§6.6: owned by the VM, not the VMI, so a VMI's deletion (a restart) does not take it with it."""
    fresh = template(owner=None, uid=None)
    [own] = [a for a in device_actions(vmi("u1"), fresh, SOON, GRACE) if a.do is Do.OWN]
    owners = metadata_changes(fresh, own)["owner_references"]
    assert [(o.kind, o.name, o.uid) for o in owners] == [("VirtualMachine", "vm", "vm-uid")]


def test_a_bare_vmis_template_device_is_still_owned_by_the_vmi() -> None:
    """§6.6: a VMI no VM controls keeps §6.2's lifetime."""
    [own] = [
        a for a in device_actions(vmi("u1", vm=False), template(owner=None, uid=None), SOON, GRACE) if a.do is Do.OWN
    ]
    assert (own.vm, own.uid) == ("", "u1")


def test_the_vmi_gone_asks_for_the_vm_then_keeps_the_device_while_it_wants_to_run() -> None:
    """§6.6: the decision reads the VM first; a VM that wants to run keeps the device Bound, marked since now."""
    c = vmi(None)
    assert dos(device_actions(c, template(), SOON, GRACE)) == [Do.READ_VM]
    [keep] = device_actions(c, template(), SOON, GRACE, vm_runs=True)
    assert keep.do is Do.KEEP
    status = status_after(template(), keep)
    assert status.phase is not None and status.node_name == "n1" and status.attached_to is not None
    assert (
        GPUDevice.from_wire({**template().wire(), "status": status.model_dump(by_alias=True, mode="json")}).kept_since
        == SOON
    )


def test_a_kept_device_stays_until_the_grace_period_then_goes() -> None:
    """§6.6: no new VMI within the grace period (counted from the keep): deleted; before it, nothing to do."""
    kept = template(kept=SOON)
    assert device_actions(vmi(None), kept, SOON + dt.timedelta(seconds=30), GRACE, vm_runs=True) == []
    assert dos(device_actions(vmi(None), kept, SOON + GRACE, GRACE, vm_runs=True)) == [Do.DELETE]
    assert due(kept, GRACE, SOON) == SOON + RECHECK  # its VM is read again meanwhile


def test_a_vm_that_stops_or_goes_lets_its_kept_device_go() -> None:
    """§6.6: the VM halted, being deleted or gone (vm_runs False): deleted at once, with the reason."""
    [delete] = device_actions(vmi(None), template(kept=SOON), SOON, GRACE, vm_runs=False)
    assert delete.do is Do.DELETE and "VirtualMachine vm does not want to run" in delete.reason


def test_a_bare_vmis_template_device_goes_with_it() -> None:
    """§6.2 unchanged for a VMI no VM controls: no read, deleted at once."""
    assert dos(
        device_actions(vmi(None), template(owner={**VM_REF, "kind": "VirtualMachineInstance"}), SOON, GRACE)
    ) == [Do.DELETE]


def test_the_next_vmi_recorded_on_the_device_ends_the_keep() -> None:
    """§6.6: the VM's next VMI re-attached it at admission; its uid recorded, the device is kept no more."""
    body = template(uid=None, kept=SOON)
    [record] = [a for a in device_actions(vmi("u2"), body, SOON, GRACE) if a.do is Do.RECORD_UID]
    assert [c.type for c in status_after(body, record).conditions] == []


def test_an_unattached_device_of_a_vm_that_wants_to_run_is_kept_too() -> None:
    """§6.6: a restart's admission refused and undone leaves it unattached: kept for the VM, not orphaned."""
    loose = GPUDevice.from_wire({**template().wire(), "status": {"phase": "Bound", "nodeName": "n1"}})
    assert dos(device_actions(vmi(None), loose, LATE, GRACE)) == [Do.READ_VM]
    assert dos(device_actions(vmi(None), loose, LATE, GRACE, vm_runs=True)) == [Do.KEEP]
    assert dos(device_actions(vmi(None), loose, LATE, GRACE, vm_runs=False)) == [Do.DELETE]


def vm(
    strategy: str | None = None, *, running: bool | None = None, requests: list[str] = (), deleting: bool = False
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if strategy:
        spec["runStrategy"] = strategy
    if running is not None:
        spec["running"] = running
    meta: dict[str, Any] = {"name": "vm", "uid": "vm-uid"}
    if deleting:
        meta["deletionTimestamp"] = EPOCH.isoformat()
    return {"metadata": meta, "spec": spec, "status": {"stateChangeRequests": [{"action": a} for a in requests]}}


def test_which_vms_want_to_run() -> None:
    """§6.6 from KubeVirt's fields: run strategies that restart, `running`, and a Stop as the last request."""
    assert wants_to_run(vm("Always")) and wants_to_run(vm("RerunOnFailure")) and wants_to_run(vm(running=True))
    assert wants_to_run(vm("Always", requests=["Stop", "Start"]))  # virtctl restart
    assert wants_to_run(vm("Manual", requests=["Start"]))
    assert not wants_to_run(vm("Halted")) and not wants_to_run(vm("Once")) and not wants_to_run(vm(running=False))
    assert not wants_to_run(vm("Manual")) and not wants_to_run(vm("Manual", requests=["Stop"]))
    assert not wants_to_run(vm("Always", requests=["Stop"]))
    assert not wants_to_run(vm("Always", deleting=True)) and not wants_to_run(None)
