"""The webhook's side of the bind protocol (§3, §4): attach the set with its request, wait, judge, undo.

The VMI admission executor (runtime.admission.vmi_webhook) first asks `already_placed` whether a
reinvocation's answer is in place. Otherwise it reads each device fresh, asks `refusal`
whether it may still attach it, writes what `requested` returns under the device's
resourceVersion, and waits until `answered` hands it the set; `judge_answer` says whether
that binds the VMI or refuses it. On a refusal, `undone` and `taken_over` say what of
its writes it takes back. The binder's side is `requests`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cozygpu.api import Attachment, BindRequest, BindResult, GPUDevice
from cozygpu.decisions.admission import Member, ident, unavailable
from cozygpu.state.cluster import Cluster

# §3: a Succeeded request younger than the API server's request timeout is this
# create's own (a reinvocation); an older one belongs to an earlier VMI of the name.
REQUEST_REUSE = dt.timedelta(minutes=1)


@dataclass(frozen=True)
class Attach:
    """One device's status update: its attachment and the request, written together (§4)."""

    device: GPUDevice  # as it is to be written
    attaching: bool  # this call makes the attachment, so a refusal's undo takes it back (§3)


def refusal(device: GPUDevice | None, name: str, vmi: str) -> str | None:
    """§3: a device gone, being deleted or attached to another VMI between the check and the write."""
    if device is None:
        return f"GPUDevice {name} no longer exists"
    return unavailable(device, vmi)


def earlier_vmi(device: GPUDevice) -> str | None:
    """The uid of an earlier VMI object of this name that claimed the device's attachment (the VMI under
    admission has no uid yet); the executor asks the API whether it still exists."""
    attached = device.status.attached_to
    return attached.uid if attached is not None and attached.claimed else None


def requested(device: GPUDevice, vmi: str, request: BindRequest, now: dt.datetime, *, earlier_gone: bool) -> Attach:
    """§4: the request on the device, attached to `vmi` unless it already is. An attachment an earlier VMI of
    the name claimed becomes this call's once that VMI is gone (a restart racing the collector, §6.2)."""
    attached = device.status.attached_to
    attaching = attached is None or (attached.claimed and earlier_gone)
    status = device.status.model_copy(
        update={"attached_to": Attachment(vmi=vmi, since=now) if attaching else attached, "bind_request": request}
    )
    return Attach(device.model_copy(update={"status": status}), attaching)


@dataclass(frozen=True)
class Waiting:
    """Not every device of the set carries the binder's answer to the request yet."""


@dataclass(frozen=True)
class Bound:
    """The binder placed every device of the set on `node`."""

    node: str


@dataclass(frozen=True)
class Refused:
    """The binder refused the set, or its answer does not hold together; `message` is the tenant's."""

    message: str


Verdict = Waiting | Bound | Refused


def verdict(cluster: Cluster, namespace: str, request: BindRequest) -> Verdict:
    """§4: the binder's answer to the request as the view has it, judged in one place. An answer the binder has
    only assumed is not one yet: its write may still lose."""
    devices = [cluster.devices.get((namespace, n)) for n in request.devices]
    carried = [
        d
        for d in devices
        if d is not None
        and d.status.bind_request is not None
        and d.status.bind_request.id == request.id
        and not d.status.bind_request.open
        and not cluster.devices.assumed(namespace, d.name)
    ]
    if len(carried) != len(devices):
        return Waiting()
    nodes: set[str] = set()
    for d in carried:
        r = d.status.bind_request
        if r is None or r.result is not BindResult.SUCCEEDED:
            return Refused(r.message if r is not None and r.message else "the GPU binder could not place the set")
        if not d.holds_gpus or not d.status.node_name:
            return Refused(f"the GPU binder answered, but {ident(d)} holds no node")
        nodes.add(d.status.node_name)
    if len(nodes) != 1:
        return Refused("the GPU binder placed the set on more than one node: " + ", ".join(sorted(nodes)))
    return Bound(nodes.pop())


def already_placed(members: Sequence[Member], vmi: str, now: dt.datetime) -> str | None:
    """§3 reinvocation: the node when a recent Succeeded request for this VMI placed exactly this set.

    Only attachments without a uid count: the VMI under admission has none yet (the API server
    assigns it after mutating admission), so one with a uid was made for an earlier VMI of the name."""
    names = {m.device.name for m in members}
    node: str | None = None
    for m in members:
        d = m.device
        r = d.status.bind_request
        if (
            d.status.attached_to is None
            or d.status.attached_to.vmi != vmi
            or d.status.attached_to.claimed
            or r is None
            or r.vmi != vmi
            or r.result is not BindResult.SUCCEEDED
            or now - r.requested_at >= REQUEST_REUSE
            or set(r.devices) != names
            or not d.holds_gpus
            or (node is not None and d.status.node_name != node)
        ):
            return None
        node = d.status.node_name
    return node


def taken_over(device: GPUDevice, request_id: str) -> bool:
    """A template device one admission created that another has since taken for the same VMI name: it carries
    that call's request (kept once answered). The creator's undo leaves it. A uid on its attachment proves
    nothing here: the collector records the uid of the VMI of the name that names it, the other call's too."""
    request = device.status.bind_request
    return request is not None and request.id != request_id


def undone(device: GPUDevice, vmi: str, request_id: str, attached_by_us: bool) -> GPUDevice | None:
    """The device with what one refused admission wrote taken back: its own request, and the attachment it
    made if no VMI object has claimed it since (a uid recorded); None when there is nothing of it left."""
    changes: dict[str, Any] = {}
    request = device.status.bind_request
    if request is not None and request.id == request_id:
        changes["bind_request"] = None
    attached = device.status.attached_to
    if attached_by_us and attached is not None and attached.vmi == vmi and not attached.claimed:
        changes["attached_to"] = None
    if not changes:
        return None
    return device.model_copy(update={"status": device.status.model_copy(update=changes)})
