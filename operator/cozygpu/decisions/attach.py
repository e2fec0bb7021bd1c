"""The webhook's side of the bind protocol (§4): attach the set with its request, then wait for the answer.

The VMI admission executor (runtime.vmi_webhook) reads each device fresh, asks `refusal`
whether it may still attach it, writes what `requested` returns under the device's
resourceVersion, and waits until `answered` hands it the set; `admission.judge_answer`
then says whether that answer binds the VMI or refuses it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from cozygpu.api import Attachment, BindRequest, GPUDevice
from cozygpu.decisions.admission import unavailable
from cozygpu.state.cluster import Cluster


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


def answered(cluster: Cluster, namespace: str, request: BindRequest) -> list[GPUDevice] | None:
    """§4: the set once every device it names carries the binder's answer to this request, else None. An
    answer the binder has only assumed is not one yet: its write may still lose."""
    devices = [cluster.device(namespace, n) for n in request.devices]
    if all(
        d is not None
        and d.status.bind_request is not None
        and d.status.bind_request.id == request.id
        and not d.status.bind_request.open
        and not cluster.assumed(namespace, d.name)
        for d in devices
    ):
        return [d for d in devices if d is not None]
    return None
