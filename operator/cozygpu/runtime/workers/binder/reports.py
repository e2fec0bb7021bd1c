"""What the binder's decisions tell (§10): Events on devices, the bind histogram, and their log lines.

Called by the binder's loop (runtime.workers.binder) once an answer is written, by its mover
(runtime.workers.binder.mover) once an idle move is, and by its evacuator (runtime.workers.binder.evacuator) at
each step of a VM's evacuation (§6.8). Events go to the tenant who owns the device and name
no other tenant's objects (§14); the log, which only the platform team reads, says everything.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence

import structlog

from cozygpu.api import GPUDevice
from cozygpu.decisions.evacuation import Evacuation, Reserve, Restart, Stop
from cozygpu.decisions.idlemoves import Move
from cozygpu.decisions.placement import NoPlacement, Placement
from cozygpu.decisions.requests import Answer
from cozygpu.runtime.events import Recorder
from cozygpu.runtime.metrics import Metrics

log = structlog.get_logger("cozygpu.binder")


def answered(
    answer: Answer, events: Recorder | None, metrics: Metrics | None, now: dt.datetime, started: float
) -> None:
    """A bind request's answer is written on every device of its set."""
    outcome, request = answer.outcome, answer.request
    for device in answer.devices:
        if events is None:
            break
        if isinstance(outcome, NoPlacement):
            events.post(device, "Failed", f"VMI {request.vmi}: {outcome.message}")
        elif device.holds_gpus and device.status.node_name != outcome.node:
            was = device.status.node_name
            events.post(device, "Moved", f"moved from node {was} to {outcome.node} for VMI {request.vmi}")
        elif not device.holds_gpus:
            events.post(device, "Bound", f"bound on node {outcome.node} for VMI {request.vmi}")
    placed = isinstance(outcome, Placement)
    if metrics is not None:
        waited = max(0.0, (now - request.requested_at).total_seconds())
        metrics.bind.labels("Succeeded" if placed else "Failed").observe(waited)
    log.info(
        "bind.answered",
        request_id=request.id,
        namespace=answer.namespace,
        vmi=request.vmi,
        devices=[d.name for d in answer.devices],
        result="Succeeded" if placed else "Failed",
        node=outcome.node if isinstance(outcome, Placement) else None,
        moved=list(outcome.moves) if isinstance(outcome, Placement) else [],
        message=outcome.message if isinstance(outcome, NoPlacement) else None,
        detail=outcome.detail if isinstance(outcome, NoPlacement) else None,
        duration_ms=round((time.monotonic() - started) * 1000, 1),
    )


def moved_idle(move: Move, events: Recorder | None, room_for: Sequence[GPUDevice]) -> None:
    """§5.7: an idle device was moved to make room on its old node for the set `room_for` (named in the log alone)."""
    d = room_for[0]
    _moved(
        move,
        events,
        "idle",
        f"moved from node {move.origin} to {move.to} while attached to no VMI, to make room on {move.origin} "
        "for an order that fit on no node (§5.7)",
        for_namespace=d.namespace,
        for_vmi=d.status.attached_to.vmi if d.status.attached_to is not None else None,
        for_devices=[x.name for x in room_for],
    )


def moved_off_cordoned(move: Move, events: Recorder | None) -> None:
    """§6.8: an idle device left a node taken out of service for one that serves its class."""
    _moved(
        move,
        events,
        "node maintenance",
        f"node maintenance: moved from node {move.origin}, which is cordoned, to {move.to} while attached to no"
        " VMI (§6.8)",
    )


def _moved(move: Move, events: Recorder | None, reason: str, message: str, **context: object) -> None:
    """The log line for the platform team (with `context`), the Event for the device's tenant (naming only its own)."""
    device = move.device
    log.info(
        "device.moved",
        namespace=device.namespace,
        device=device.name,
        node=move.origin,
        to=move.to,
        reason=reason,
        **context,
    )
    if events is not None:
        events.post(device, "Moved", message)


def move_failed(move: Move, error: BaseException | None) -> None:
    log.info(
        "device.move_failed",
        namespace=move.device.namespace,
        device=move.device.name,
        node=move.origin,
        to=move.to,
        error=str(error) if error is not None else "someone wrote first",
    )


# -- node maintenance (§6.8) ----------------------------------------------------------------


def evacuating(ev: Evacuation, step: Reserve) -> None:
    """The set's moves to the node reserved for the VM's restart are decided (written next)."""
    devices = [d.name for d in step.devices]
    log.info("vmi.evacuating", namespace=ev.namespace, vmi=ev.vmi, node=ev.node, to=step.node, devices=devices)


def reserved(ev: Evacuation, step: Reserve, events: Recorder | None) -> None:
    """The moves are written: each moved device's tenant hears where its VM starts again."""
    message = (
        f"node maintenance: moved from node {ev.node}, which is being drained, to {step.node}, where VMI {ev.vmi} "
        "starts again (§6.8)"
    )
    for device in step.devices:
        if events is not None:
            events.post(device, "Moved", message)


def evacuated(ev: Evacuation, step: Restart | Stop, events: Recorder | None) -> None:
    """The VMI is deleted: its VM starts the next on the reserved node (Restart), or nothing does (Stop)."""
    if isinstance(step, Restart):
        log.info("vmi.evacuated", namespace=ev.namespace, vmi=ev.vmi, node=ev.node, to=step.node)
        return
    log.info("vmi.stopped", namespace=ev.namespace, vmi=ev.vmi, node=ev.node)
    for device in ev.devices:
        if events is not None:
            events.post(
                device, "Released", f"node maintenance: VMI {ev.vmi} was stopped to leave node {ev.node} (§6.8)"
            )


def evacuation_failed(ev: Evacuation, error: BaseException | None) -> None:
    log.info(
        "vmi.evacuation_failed",
        namespace=ev.namespace,
        vmi=ev.vmi,
        node=ev.node,
        error=str(error) if error is not None else "someone wrote first",
    )


def evacuation_uncounted(node: str, error: BaseException) -> None:
    log.warning("gpunode.evacuated_uncounted", node=node, error=str(error))


def evacuation_blocked(ev: Evacuation, reason: str, events: Recorder | None) -> None:
    """The VM keeps running on the node being drained: the tenant hears why on each device, the platform in the log."""
    log.info("vmi.evacuation_blocked", namespace=ev.namespace, vmi=ev.vmi, node=ev.node, reason=reason)
    for device in ev.devices:
        if events is not None:
            message = (
                f"node maintenance: VMI {ev.vmi} keeps running on node {ev.node}, which is being drained: {reason}"
            )
            events.post(device, "EvacuationBlocked", message)
