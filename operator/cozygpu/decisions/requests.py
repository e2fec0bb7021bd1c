"""The binder's side of the bind protocol (§4): which requests are ready, and what to answer.

A request is answered once every device it names carries its id. `assess` returns
what the binder should do with one request id: nothing yet, fail it, or place it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from cozygpu.api import BindRequest, GPUDevice
from cozygpu.decisions.budgets import check_orders, counts
from cozygpu.decisions.orders import Order
from cozygpu.decisions.placement import NoPlacement, Placement, not_ready, place
from cozygpu.state.cluster import Cluster


@dataclass(frozen=True)
class Wait:
    """Some named device does not carry the id yet: the webhook is still writing."""

    why: str


@dataclass(frozen=True)
class Answer:
    """Write this answer on every device that carries the request."""

    request: BindRequest
    namespace: str
    devices: tuple[GPUDevice, ...]  # the devices carrying the id, in the request's order
    outcome: Placement | NoPlacement


Assessment = Wait | Answer | None


def _request_of(devices: list[GPUDevice]) -> BindRequest | None:
    for d in devices:
        if d.status.bind_request is not None:
            return d.status.bind_request
    return None


def assess(
    cluster: Cluster,
    request_id: str,
    now: dt.datetime,
    incomplete_after: dt.timedelta,
    prior: Sequence[Order] = (),
    *,
    budgets_required: bool = False,
    guarded: bool = False,
) -> Assessment:
    """None when there is nothing to answer (answered already, or gone).

    `prior` are orders admitted elsewhere that the view has not seen yet (§7.4); with `guarded`, a set that would
    give a class not ready new units waits (§12.3, `placement.not_ready`)."""
    carriers = cluster.devices.of_request(request_id)
    if not carriers or all(d.open_request is None for d in carriers):
        return None
    request = _request_of(carriers)
    assert request is not None
    namespace = carriers[0].namespace or ""
    by_name = {d.name: d for d in carriers}

    def fail(message: str) -> Answer:
        ordered = tuple(by_name[n] for n in request.devices if n in by_name)
        return Answer(request, namespace, ordered, NoPlacement(message))

    for name in request.devices:
        if name in by_name:
            continue
        other = cluster.devices.get((namespace, name))
        if other is not None and other.deleting:
            return fail(f"GPUDevice {name} is being deleted")
        theirs = other.open_request if other is not None else None
        if theirs is not None and theirs.id != request_id:
            return fail(f"GPUDevice {name} is part of another bind request")
        if now - request.requested_at > incomplete_after:
            missing = "does not exist" if other is None else "does not carry this request"
            return fail(f"GPUDevice {name} {missing}")
        return Wait(f"GPUDevice {name} does not carry the request yet")

    devices = tuple(by_name[n] for n in request.devices)
    return judge(
        cluster,
        request,
        namespace,
        devices,
        now=now,
        incomplete_after=incomplete_after,
        prior=prior,
        budgets_required=budgets_required,
        guarded=guarded,
    )


def judge(
    cluster: Cluster,
    request: BindRequest,
    namespace: str,
    devices: tuple[GPUDevice, ...],
    *,
    now: dt.datetime,
    incomplete_after: dt.timedelta,
    prior: Sequence[Order] = (),
    budgets_required: bool = False,
    guarded: bool = False,
) -> Wait | Answer:
    """The answer to a request every device of which carries it (`devices`, in the request's order): also for a
    set whose request is not written yet, when the binder answers it in the request's own write (§4, §13.4)."""

    def fail(message: str) -> Answer:
        return Answer(request, namespace, devices, NoPlacement(message))

    for d in devices:
        if d.deleting:
            return fail(f"GPUDevice {d.name} is being deleted")
        attached = d.status.attached_to
        if attached is None or attached.vmi != request.vmi:
            return fail(f"GPUDevice {d.name} is not attached to VMI {request.vmi}")

    if guarded and (unready := not_ready(cluster, devices)) is not None:
        # §12.3: a class moments old; answered once it is ready, or refused after the same bound as a slow write.
        if now - request.requested_at <= incomplete_after:
            return Wait(unready.message)
        return Answer(request, namespace, devices, unready)
    # §5.4: new devices are orders; check them again now, serialised with every other decision.
    orders = list(new_orders(namespace, devices).values())
    refusal = check_orders(cluster, orders, prior, required=budgets_required)
    if refusal is not None:
        return Answer(request, namespace, devices, NoPlacement(refusal))
    return Answer(request, namespace, devices, place(cluster, devices, guarded=guarded))


def new_orders(namespace: str, devices: Sequence[GPUDevice]) -> dict[str, Order]:
    """§7.1: the devices of a set that are orders at bind time, by name: those that do not count against budgets
    yet (template devices; a held device counts from its creation)."""
    return {
        d.name: Order(namespace, d.spec.class_name, d.spec.count, f"GPUDevice {d.name}")
        for d in devices
        if not counts(d)
    }
