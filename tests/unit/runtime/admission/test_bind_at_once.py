"""A set's bind request and its answer in one write per device where the serving replica's binder decides (§4,
§13.4; issue 37 item 8), against the in-memory API: what the protocol writes in two steps, one write carries,
and whatever the binder cannot decide at once is left to the protocol, which writes and answers it as ever."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from cozygpu.api import BindRequest, GPUDevice, kinds
from cozygpu.api.meta import now
from cozygpu.decisions import attach
from cozygpu.decisions.pinning import is_pinned
from cozygpu.kube.adapter import Forbidden
from cozygpu.runtime.admission.outcomes import InternalError, Refusal
from cozygpu.runtime.admission.reservations import Reservations
from cozygpu.runtime.admission.vmi_webhook import VMIAdmission
from cozygpu.runtime.admission.waiters import Waiters
from cozygpu.runtime.view import View
from cozygpu.runtime.workers.binder import Binder
from tests.support.bodies import vmi_body
from tests.support.memkube import MemKube
from tests.support.views import A10, gpu_class, node, request
from tests.support.writing import NS, device, seen_with_status, writer

Body = dict[str, Any]
TEMPLATE = {"deviceTemplate": {"className": "a10", "count": 1}}


def _cluster(units: int = 8) -> tuple[Binder, VMIAdmission, View, MemKube]:
    """One node of `units` A10s, held device h Bound there, and this replica's webhook beside its binder."""
    w, view, kube = writer()
    view.apply(kinds.NODE, node("n1", {A10: units}))
    view.apply(kinds.GPU_CLASS, kube.put(kinds.GPU_CLASS, gpu_class("a10")))
    held = kube.put(kinds.GPU_DEVICE, device("h"))
    view.apply(kinds.GPU_DEVICE, kube.change(kinds.GPU_DEVICE, {**held, "status": _bound_on("n1")}, status=True))
    binder = Binder(view.cluster, w, incomplete_after=30, concurrency=8)
    view.subscribe(binder.changed)
    waiters = Waiters()
    view.subscribe(waiters.changed, kinds.GPU_DEVICE)
    admission = VMIAdmission(
        view.cluster,
        waiters,
        Reservations(ttl=30),
        bind_timeout=2,
        max_devices=8,
        writer=w,
        answer=binder.answer_at_once,
    )
    return binder, admission, view, kube


def _bound_on(node_name: str) -> Body:
    return {"phase": "Bound", "nodeName": node_name}


def _status_writes(kube: MemKube, name: str) -> int:
    return sum(1 for call in kube.calls if call == ("replace_status", "GPUDevice", name))


def _admit(admission: VMIAdmission, *refs: Body) -> Body:
    return asyncio.run(admission.admit(vmi_body("v", NS, list(refs)), dry_run=False))


async def _beside(worker: Callable[[], Coroutine[Any, Any, None]], work: Coroutine[Any, Any, Body]) -> Body:
    """`work` with the worker's loop running beside it, stopped after."""
    task = asyncio.create_task(worker())
    try:
        return await work
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _left_to_the_protocol(binder: Binder, kube: MemKube, read: GPUDevice) -> bool:
    """Whether the binder answers nothing at once for h's request built on `read`, and writes nothing."""
    request = BindRequest(id="r1", vmi="v", devices=["h"], requested_at=now())
    step = attach.requested(read, "v", request, now(), earlier_gone=False)
    before = len(kube.calls)
    return asyncio.run(binder.answer_at_once(NS, [step.device], request)) is None and kube.calls[before:] == []


def _held(kube: MemKube) -> GPUDevice:
    return GPUDevice.from_wire(kube.stored(kinds.GPU_DEVICE, "h", NS) or {})


def test_on_the_deciding_replica_request_and_answer_are_one_write_per_device() -> None:
    """The binder holds the Lease in this process: each device of the set (a held one, a template one) gets one
    status write carrying the request answered Succeeded on the set's node, with no pass of the binder's loop."""
    binder, admission, _, kube = _cluster()
    binder.listen()
    admitted = _admit(admission, {"device": "h"}, TEMPLATE)
    assert is_pinned(admitted["spec"], "n1")
    for name in ("h", "v-gpu-1"):
        assert _status_writes(kube, name) == 1
        stored = kube.stored(kinds.GPU_DEVICE, name, NS)
        assert stored is not None
        status = stored["status"]
        assert (status["phase"], status["nodeName"], status["attachedTo"]["vmi"]) == ("Bound", "n1", "v")
        assert status["bindRequest"]["result"] == "Succeeded"


def test_a_replica_whose_binder_does_not_decide_writes_the_request_for_the_leader() -> None:
    """A standby's binder hears nothing and decides nothing: its webhook writes the request, and the binder that
    decides answers it in a write of its own, two status writes per device, as the protocol has it (§4, §10)."""
    binder, admission, _, kube = _cluster()

    async def answered_elsewhere() -> Body:
        return await _beside(binder.run, admission.admit(vmi_body("v", NS, [TEMPLATE]), dry_run=False))

    # A binder that runs decides: the webhook is made again with no binder of its own beside it.
    admission._answer = None
    admitted = asyncio.run(answered_elsewhere())
    assert is_pinned(admitted["spec"], "n1")
    assert _status_writes(kube, "v-gpu-0") == 2


def test_a_set_that_has_no_room_now_is_left_to_the_protocol_and_refused_in_the_binders_words() -> None:
    """No node has room for the template unit: the binder does not refuse in the request's write; the request
    is written and the binder's pass refuses it with its reason, which the tenant reads (§4, §5.5)."""
    binder, admission, _, kube = _cluster(units=1)

    async def refused() -> Body:
        return await _beside(binder.run, admission.admit(vmi_body("v", NS, [{"device": "h"}, TEMPLATE]), dry_run=False))

    with pytest.raises(Refusal, match="free unit"):
        asyncio.run(refused())
    assert _status_writes(kube, "h") >= 2  # the request, then the refusal, then the undo
    assert kube.stored(kinds.GPU_DEVICE, "v-gpu-1", NS) is None  # the undo deleted what the admission made
    held = kube.stored(kinds.GPU_DEVICE, "h", NS)
    assert held is not None and "attachedTo" not in held["status"]


def test_the_binder_answers_nothing_at_once_for_a_version_its_view_has_moved_past() -> None:
    """A device written since the webhook read it: the binder writes nothing and leaves the set to the protocol,
    whose write reads it fresh; so an answer is never built on what the view no longer has."""
    binder, _, view, kube = _cluster()
    binder.listen()
    read = _held(kube)
    later = kube.change(kinds.GPU_DEVICE, {**(kube.stored(kinds.GPU_DEVICE, "h", NS) or {}), "status": _bound_on("n1")})
    view.apply(kinds.GPU_DEVICE, later)
    assert _left_to_the_protocol(binder, kube, read)


def test_the_binder_answers_nothing_at_once_unless_it_decides() -> None:
    """Before `listen` (a standby, or a binder not started) the binder writes nothing for a webhook's set."""
    binder, _, _, kube = _cluster()
    assert _left_to_the_protocol(binder, kube, _held(kube))


def test_an_answer_that_lands_on_part_of_the_set_is_refused_and_taken_back() -> None:
    """Another writer changed h between the webhook's read and the one write: the template device's write lands,
    h's does not. The admission is refused (KubeVirt retries) and its undo leaves neither device with its marks."""
    binder, admission, _, kube = _cluster()
    binder.listen()
    held = kube.stored(kinds.GPU_DEVICE, "h", NS) or {}
    kube.before_next("replace_status", lambda: kube.change(kinds.GPU_DEVICE, {**held, "status": _bound_on("n1")}))
    with pytest.raises(Refusal, match="changed while being attached"):
        _admit(admission, {"device": "h"}, TEMPLATE)
    assert kube.stored(kinds.GPU_DEVICE, "v-gpu-1", NS) is None
    after = kube.stored(kinds.GPU_DEVICE, "h", NS)
    assert after is not None and "attachedTo" not in after["status"] and "bindRequest" not in after["status"]


def test_a_request_written_before_is_answered_first_so_none_is_overtaken() -> None:
    """Another replica's webhook wrote a request the pass has not answered yet: the binder answers nothing at
    once: the newer set waits its turn behind it (§4: requests oldest first), its request written."""
    binder, _, view, kube = _cluster()
    binder.listen()
    older = device("o")
    older["status"] = request("r0", "w", ["o"], now())
    seen_with_status(view, kube, older)
    assert _left_to_the_protocol(binder, kube, _held(kube))


def test_a_write_the_api_fails_is_an_error_and_what_landed_is_taken_back() -> None:
    """The API refuses one device's write (an error, not a conflict): the admission fails closed with the API's
    words (§3), and its undo leaves neither device with its marks, as when the request alone was written."""
    binder, admission, _, kube = _cluster()
    binder.listen()
    kube.fail_next(Forbidden(403, "Forbidden", "status writes are not allowed here"), method="replace_status")
    with pytest.raises(InternalError, match="status writes are not allowed here"):
        _admit(admission, {"device": "h"}, TEMPLATE)
    assert kube.stored(kinds.GPU_DEVICE, "v-gpu-1", NS) is None
    after = kube.stored(kinds.GPU_DEVICE, "h", NS)
    assert after is not None and "attachedTo" not in after["status"] and "bindRequest" not in after["status"]
