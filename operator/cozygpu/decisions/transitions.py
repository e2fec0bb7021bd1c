"""The device status changes the binder writes, as builders: device in, device out.

Each returns a copy; the executor (runtime.workers.binder) writes it with the device's
resourceVersion, so a concurrent writer makes the write fail instead of being lost.
"""

from __future__ import annotations

import datetime as dt

from cozygpu.api import BindResult, Condition, ConditionStatus, GPUDevice, Phase
from cozygpu.api.names import CONDITION_PLACED, REASON_EVACUATING


def _placed(device: GPUDevice, ok: bool, reason: str, message: str, now: dt.datetime) -> list[Condition]:
    status = ConditionStatus.TRUE if ok else ConditionStatus.FALSE
    others = [c for c in device.status.conditions if c.type != CONDITION_PLACED]
    before = next((c for c in device.status.conditions if c.type == CONDITION_PLACED), None)
    if before is not None and before.status == status and before.reason == reason and before.message == message:
        return device.status.conditions
    since = before.last_transition_time if before is not None and before.status == status else now
    placed = Condition(type=CONDITION_PLACED, status=status, reason=reason, message=message, last_transition_time=since)
    return [*others, placed]


def _with_status(device: GPUDevice, **changes: object) -> GPUDevice:
    return device.model_copy(update={"status": device.status.model_copy(update=changes)})


def _holds(device: GPUDevice, node: str) -> str:
    units = "unit" if device.spec.count == 1 else "units"
    return f"holds {device.spec.count} {units} on node {node}"


def bound(device: GPUDevice, node: str, now: dt.datetime, request_id: str | None = None) -> GPUDevice:
    """Bound on `node`; with a request id, that request answered Succeeded."""
    request = device.status.bind_request
    if request_id is not None and request is not None and request.id == request_id:
        request = request.model_copy(update={"result": BindResult.SUCCEEDED, "message": None})
    return _with_status(
        device,
        phase=Phase.BOUND,
        node_name=node,
        bind_request=request,
        message=None,
        conditions=_placed(device, True, "Bound", _holds(device, node), now),
    )


def reserved(device: GPUDevice, node: str, origin: str, now: dt.datetime) -> GPUDevice:
    """Bound on `node` while its VM still runs on `origin`: the units there are held for the VM's restart (§6.8);
    its next bind says Bound again."""
    message = f"{_holds(device, node)}, where its VM starts again off node {origin}"
    return _with_status(
        device,
        phase=Phase.BOUND,
        node_name=node,
        message=None,
        conditions=_placed(device, True, REASON_EVACUATING, message, now),
    )


def refused(device: GPUDevice, request_id: str, message: str) -> GPUDevice:
    """The request answered Failed; everything else as it was (§4: no partial placement)."""
    request = device.status.bind_request
    if request is None or request.id != request_id:
        return device
    return _with_status(
        device, bind_request=request.model_copy(update={"result": BindResult.FAILED, "message": message})
    )


def waiting(device: GPUDevice, message: str, now: dt.datetime) -> GPUDevice:
    """Pending (a new held device, or one still unplaced) with the reason it waits (§5.5)."""
    phase = device.status.phase if device.status.phase is Phase.LOST else Phase.PENDING
    if phase is Phase.LOST:
        message = f"lost from node {device.status.node_name}; {message}"
    return _with_status(
        device, phase=phase, message=message, conditions=_placed(device, False, "Unschedulable", message, now)
    )


def admitted(device: GPUDevice, now: dt.datetime) -> GPUDevice:
    """§2: a held device the operator sees for the first time becomes Pending."""
    return waiting(device, "waiting for a node with room", now)


def lost(device: GPUDevice, why: str, now: dt.datetime) -> GPUDevice:
    """§5.6: its node is gone; nodeName keeps the node it held units on."""
    return _with_status(device, phase=Phase.LOST, message=why, conditions=_placed(device, False, "NodeLost", why, now))
