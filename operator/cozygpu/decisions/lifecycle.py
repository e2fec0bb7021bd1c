"""Attachments, ownership, finalizers and garbage collection (§6), as pure decisions.

`device_actions` says what one device needs given the view: record its VMI's uid,
take that VMI (or the VirtualMachine controlling it) as owner, detach from a VMI that is
gone, delete a template device whose VMI is gone or never came, or keep it for its VM's
next VMI (§6.6; asking first for the VM, read fresh: `READ_VM`), clear a stale request,
keep the in-use finalizer exactly while a live VMI uses it. The collector
(runtime.workers.collector) calls it for the devices an event touches and, as a safety
net, for all of them on a sweep, and writes what `status_after` and `metadata_changes`
build for each action.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from cozygpu.api import Condition, ConditionStatus, GPUClass, GPUDevice, GPUDeviceStatus
from cozygpu.api.kubevirt import owned_by
from cozygpu.api.names import CONDITION_KEPT, FINALIZER_IN_USE
from cozygpu.state.cluster import Cluster


class Do(Enum):
    RECORD_UID = "record-uid"  # status: attachedTo.uid = the VMI's uid
    OWN = "own"  # metadata: ownerReference to the VMI
    ADD_FINALIZER = "add-finalizer"
    REMOVE_FINALIZER = "remove-finalizer"
    DETACH = "detach"  # status: no attachment, no request
    CLEAR_REQUEST = "clear-request"  # status: no request (nor an attachment without a live VMI)
    DELETE = "delete"  # a template device whose VMI is gone
    KEEP = "keep"  # status: condition KeptForRestart, for the VM's next VMI (§6.6)
    READ_VM = "read-vm"  # the decision needs the owner VM's wish to run: read it, and ask again (§6.6)


# The actions that write the device's metadata (the rest but DELETE write its status).
METADATA = frozenset({Do.OWN, Do.ADD_FINALIZER, Do.REMOVE_FINALIZER})


@dataclass(frozen=True)
class Action:
    do: Do
    reason: str = ""
    uid: str = ""  # the VMI's, for RECORD_UID; the owner's, for OWN and READ_VM
    vm: str = ""  # the VirtualMachine's name, for OWN (when a VM controls the VMI) and READ_VM
    at: dt.datetime | None = None  # when, for KEEP


# §6.6: how often the VM of a kept device is read again, to learn it stopped or went.
RECHECK = dt.timedelta(seconds=5)


def _expired(since: dt.datetime | None, now: dt.datetime, grace: dt.timedelta) -> bool:
    return since is not None and now - since >= grace


def device_actions(
    cluster: Cluster, device: GPUDevice, now: dt.datetime, grace: dt.timedelta, *, vm_runs: bool | None = None
) -> list[Action]:
    """What the device needs now; an empty list when it is as it should be. `vm_runs`: whether the VM that owns
    it wants to run, once read (asked for with READ_VM)."""
    namespace = device.namespace or ""
    attached = device.status.attached_to
    request = device.open_request
    live: str | None = cluster.vmis.get((namespace, attached.vmi)) if attached else None
    owner = device.vmi_owner or device.vm_owner
    # §14.2: the uid recorded is that of the VMI the admission was for: the VMI of the name names the device.
    named = (
        live is not None and attached is not None and cluster.vmis.names_device(namespace, attached.vmi, device.name)
    )
    actions: list[Action] = []
    in_use = False
    pending = False  # attached to a VMI that may yet appear: its in-use finalizer is left as it is

    if attached is not None:
        gone = attached.claimed and attached.uid != live
        if gone and not cluster.pods.guest_running(namespace, attached.uid or ""):
            # §6.2: the VMI it was attached to is gone (a new one of the name is another VMI), and §6.7 its guest:
            # no launcher pod of that VMI holds units any more.
            why = f"VMI {attached.vmi} is gone"
            return _kept_or_deleted(device, why, now, grace, vm_runs) if device.is_template else _detach(device, why)
        if gone:
            in_use = True  # §6.7: the guest still runs in its launcher pod: the units stay its until the pod ends
        elif not attached.claimed and named:
            actions.append(Action(Do.RECORD_UID, f"VMI {attached.vmi} exists", live or ""))  # §6.1 (§6.6: kept no more)
            in_use = True
        elif not attached.claimed:
            if _expired(attached.since, now, grace):
                # §6.3: the VMI never appeared (another admission refused it after ours answered); §14.2: or a
                # VMI of the name appeared that does not name the device (another create of the name won).
                why = (
                    f"VMI {attached.vmi} did not appear within the grace period"
                    if live is None
                    else (f"VMI {attached.vmi} does not reference it: another create of the name was admitted")
                )
                return [Action(Do.DELETE, why)] if device.is_template else _detach(device, why)
            # §6.5: a template device made with its finalizer keeps it for its VMI (one write fewer a start).
            pending = True
        else:
            in_use = True
        ours = device.name.startswith(f"{attached.vmi}-gpu-")
        if device.is_template and owner is None and live is not None and ours and not gone and (named or attached.uid):
            vm = cluster.vmis.vm_of(namespace, attached.vmi)  # §6.6: a VM's restart keeps them, so the VM owns them
            actions.append(
                Action(Do.OWN, f"VirtualMachine {vm[0]} owns it", vm[1], vm[0])
                if vm is not None
                else Action(Do.OWN, f"VMI {attached.vmi} owns it", live)
            )
    elif request is not None and _expired(request.requested_at, now, grace):
        actions.append(Action(Do.CLEAR_REQUEST, "the bind request went unanswered"))  # §4

    # Never placed: made by an admission still under way (a VM's comes with its owner), or one that ended early.
    made = device.is_template and attached is None and device.status.phase is None and device.vmi_owner is None
    if attached is None and device.is_template and device.vm_owner is not None and not made:
        return _kept_or_deleted(device, "no VMI uses it", now, grace, vm_runs)  # a restart's admission undone
    if attached is None and device.is_template:
        gone = not made and owner is not None and not cluster.vmis.exists(owner.uid)
        orphan = (owner is None or made) and _expired(device.metadata.creation_timestamp, now, grace)
        if gone or orphan:
            return [Action(Do.DELETE, "its VMI is gone" if gone else "no VMI uses it")]  # §6.3
        pending = pending or made  # the finalizer it was made with stays for the VMI to come

    has = FINALIZER_IN_USE in device.metadata.finalizers
    if in_use and not has and not device.deleting:
        actions.append(Action(Do.ADD_FINALIZER, "attached to a VMI that exists"))  # §6.5
    elif not in_use and has and not pending:
        actions.append(Action(Do.REMOVE_FINALIZER, "no VMI that exists uses it"))
    return actions


def _kept_or_deleted(
    device: GPUDevice, why: str, now: dt.datetime, grace: dt.timedelta, vm_runs: bool | None
) -> list[Action]:
    """§6.6: a template device whose VMI is gone stays Bound for its VirtualMachine's next VMI while the VM wants
    to run, for at most the grace period; a VMI no VM controls takes its template devices with it (§6.2)."""
    vm = device.vm_owner
    if vm is None:
        return [Action(Do.DELETE, why)]
    if vm_runs is None:
        return [Action(Do.READ_VM, why, vm.uid, vm.name)]
    if not vm_runs:
        return [Action(Do.DELETE, f"{why} and VirtualMachine {vm.name} does not want to run")]
    since = device.kept_since
    if since is None:
        return [Action(Do.KEEP, f"{why}; kept for the next VMI of VirtualMachine {vm.name}", at=now)]
    if _expired(since, now, grace):
        return [Action(Do.DELETE, f"no new VMI of VirtualMachine {vm.name} came within the grace period")]
    return []


def _detach(device: GPUDevice, why: str) -> list[Action]:
    actions = [Action(Do.DETACH, why)]
    if FINALIZER_IN_USE in device.metadata.finalizers:
        actions.append(Action(Do.REMOVE_FINALIZER, why))
    return actions


def due(device: GPUDevice, grace: dt.timedelta, now: dt.datetime) -> dt.datetime | None:
    """When the device's grace period runs out, if something about it is waiting on one; a kept device's VM is
    read again every RECHECK meanwhile (§6.6: a VM stopped or deleted lets its devices go then)."""
    attached = device.status.attached_to
    request = device.open_request
    times = []
    if device.kept_since is not None:
        times += [device.kept_since + grace, now + RECHECK]
    if attached is not None and not attached.claimed and attached.since is not None:
        times.append(attached.since + grace)
    if request is not None:
        times.append(request.requested_at + grace)
    if device.is_template and attached is None and device.vmi_owner is None and device.metadata.creation_timestamp:
        times.append(device.metadata.creation_timestamp + grace)
    return min(times) if times else None


def class_action(cluster: Cluster, cls: GPUClass) -> Do | None:
    """§6.5: a class keeps its finalizer until no device names it."""
    has = FINALIZER_IN_USE in cls.metadata.finalizers
    if not cls.deleting and not has:
        return Do.ADD_FINALIZER
    if cls.deleting and has and not cluster.devices.count_of_class(cls.name):
        return Do.REMOVE_FINALIZER
    return None


# -- what each action writes ---------------------------------------------------


def status_after(device: GPUDevice, action: Action) -> GPUDeviceStatus:
    """The device's status once a status action is done; anything else in it is kept. A release (DETACH) frees
    the device for another VMI but not its units: phase and node stay, a held device stays Bound (§2, §6.2)."""
    status = device.status
    others = [c for c in status.conditions if c.type != CONDITION_KEPT]
    if action.do is Do.RECORD_UID and status.attached_to is not None:  # §6.1; §6.6: the VM's next VMI is here
        attached = status.attached_to.model_copy(update={"uid": action.uid})
        return status.model_copy(update={"attached_to": attached, "conditions": others})
    if action.do is Do.KEEP:  # §6.6
        kept = Condition(
            type=CONDITION_KEPT,
            status=ConditionStatus.TRUE,
            reason="VirtualMachineRestarting",
            message=action.reason,
            last_transition_time=action.at,
        )
        return status.model_copy(update={"conditions": [*others, kept]})
    if action.do is Do.DETACH:  # §6.2, §6.3: the attachment goes, with the request made for it
        return status.model_copy(update={"attached_to": None, "bind_request": None})
    if action.do is Do.CLEAR_REQUEST:  # §4: a stale request
        return status.model_copy(update={"bind_request": None})
    return status


def metadata_changes(device: GPUDevice, action: Action) -> dict[str, Any]:
    """The metadata fields OWN and the finalizer actions change, as their new values; for DELETE, what comes off
    before the delete: the in-use protection, which would keep a device the collector deletes (§6.5)."""
    meta = device.metadata
    if action.do is Do.OWN:  # §6.1; §6.6: the VM controlling the VMI, when one does
        vmi = device.status.attached_to.vmi if device.status.attached_to else ""
        kind, name = ("VirtualMachine", action.vm) if action.vm else ("VirtualMachineInstance", vmi)
        return {"owner_references": [*meta.owner_references, owned_by(kind, name, action.uid)]}
    if action.do in (Do.ADD_FINALIZER, Do.REMOVE_FINALIZER, Do.DELETE):
        return {"finalizers": protected(meta.finalizers, protect=action.do is Do.ADD_FINALIZER)}
    raise ValueError(f"{action.do.value} writes the status, not the metadata")


def runs(actions: Sequence[Action]) -> list[list[Action]]:
    """The actions in the order given, consecutive metadata actions (OWN and the finalizer actions) in one run,
    which one write carries: a new template device's owner and in-use finalizer are one update, not two."""
    out: list[list[Action]] = []
    for action in actions:
        if out and action.do in METADATA and out[-1][-1].do in METADATA:
            out[-1].append(action)
        else:
            out.append([action])
    return out


def metadata_changes_of(device: GPUDevice, run: Sequence[Action]) -> dict[str, Any]:
    """What a run of metadata actions changes, each built on what the ones before it changed."""
    changes: dict[str, Any] = {}
    for action in run:
        step = metadata_changes(device, action)
        device = device.model_copy(update={"metadata": device.metadata.model_copy(update=step)})
        changes.update(step)
    return changes


def protected(finalizers: Sequence[str], *, protect: bool) -> list[str]:
    """§6.5: the finalizers with the in-use protection on or off; the others are kept, in their order."""
    others = [f for f in finalizers if f != FINALIZER_IN_USE]
    return [*others, FINALIZER_IN_USE] if protect else others
