"""The VMI admission executor (§3, §4): the fresh reads, the plan, the bind, the patch, and the undo.

Called by the mutating webhook handler (runtime.process.handlers) for CREATE of VMIs with
the device-reference label. Referenced devices and the VMI's name are read fresh
from the API through the writer, into the view; the rest comes from the view. The rules are one
pure call (`decisions.plans.plan`), the binder's answer one verdict (`decisions.attach.verdict`),
what the set puts on the VMI an output (`decisions.outputs`), and every read-decide-write goes
through `Writer.update`. A refusal after any write undoes exactly what this call wrote before it
answers; what it cannot undo, the garbage collector clears (§6). Where this replica's binder decides, the
request and its answer are one write per device (`answer`, §13.4).

Why one module: the undo takes back exactly what the bind wrote, from the one record of it (`_Writes`);
apart, each would need the other's every step.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ParamSpec

import structlog

from cozygpu.api import BindRequest, GPUDevice, kinds, references
from cozygpu.api.meta import now as utcnow
from cozygpu.api.names import FINALIZER_IN_USE, LABEL_DEVICE_REFERENCE, TRUE, template_device_name
from cozygpu.api.references import HeldRef, TemplateRef
from cozygpu.decisions import admission, attach, lifecycle, plans
from cozygpu.decisions.admission import Member
from cozygpu.decisions.outputs import DEVICE_PLUGIN, Output
from cozygpu.kube.adapter import ApiError
from cozygpu.runtime.admission.calls import Turns, gather_bounded, gather_outcomes
from cozygpu.runtime.admission.outcomes import InternalError, Refusal
from cozygpu.runtime.admission.reservations import Reservations
from cozygpu.runtime.admission.waiters import Waiters
from cozygpu.runtime.events import Recorder
from cozygpu.runtime.writes import Outcome, State, Step, Writer
from cozygpu.state.cluster import Cluster

log = structlog.get_logger("cozygpu.webhook")

P = ParamSpec("P")
Body = dict[str, Any]
# The Lease holder's binder answering a set in its request's own write (runtime.workers.binder.Binder.answer_at_once):
# by device, True if the write landed, False if someone wrote first, or the API's failure; None when it leaves
# the request to the protocol.
AnswerAtOnce = Callable[[str, Sequence[GPUDevice], BindRequest], Awaitable[dict[str, bool | BaseException] | None]]
UNDO_TIMEOUT = 5.0  # seconds an undo may take before the refusal is answered; the collector has the rest


@dataclass
class _Writes:
    """What this call wrote, so a refusal can undo exactly that."""

    created: list[GPUDevice] = field(default_factory=list)
    attached: list[str] = field(default_factory=list)  # attachments this call made
    requested: list[str] = field(default_factory=list)  # devices carrying this call's request
    request_id: str = ""


class VMIAdmission:
    def __init__(
        self,
        cluster: Cluster,
        waiters: Waiters,
        reservations: Reservations,
        *,
        bind_timeout: float,
        max_devices: int,
        writer: Writer,
        max_per_namespace: int = 128,
        budgets_required: bool = False,
        events: Recorder | None = None,
        calls_in_flight: int = 4,
        turns: Turns | None = None,
        output: Output = DEVICE_PLUGIN,
        answer: AnswerAtOnce | None = None,
    ) -> None:
        """`output`: what the admitted set becomes on the VMI (decisions.outputs; the device plugin's entries);
        `answer`: this process's binder, which answers a set in its request's write while it holds the Lease."""
        self._cluster = cluster
        self._answer = answer
        self._output = output
        self._waiters = waiters
        self._reservations = reservations
        self._bind_timeout = bind_timeout
        self._max_devices = max_devices
        # API calls one admission has in flight at once: a VMI with many devices must not fill the shared
        # pool and queue every other tenant's calls behind its own (issue 12 item 2).
        self._calls_in_flight = calls_in_flight
        self._turns = turns or Turns(max_per_namespace * calls_in_flight)  # every call in a turn (issue 34 item 6)
        self._writer = writer  # its writes' responses go into the view, which wakes the binder
        # Admissions under way per namespace (§14.3): one tenant cannot hold every API call and bind.
        self._max_per_namespace = max_per_namespace
        self._budgets_required = budgets_required
        self._under_way: dict[str, int] = {}
        self._events = events

    async def admit(self, vmi: dict[str, Any], dry_run: bool) -> dict[str, Any]:
        """The VMI as admitted (gpus entries, node pin); raises Refusal or InternalError."""
        meta = vmi.get("metadata") or {}
        labels = meta.get("labels") or {}
        if not isinstance(labels, dict) or labels.get(LABEL_DEVICE_REFERENCE) != TRUE:
            return vmi  # not ours to judge (the API server itself refuses labels that are not a map)
        name, namespace = meta.get("name") or "", meta.get("namespace") or ""
        started = time.monotonic()
        bound = structlog.contextvars.bound_contextvars(namespace=namespace, vmi=name or meta.get("generateName"))
        with bound, self._one_of(namespace):
            try:
                admitted, node = await self._admit(vmi, name, namespace, dry_run)
            except Refusal as e:
                log.info("vmi.refused", reason=str(e), dry_run=dry_run, duration_ms=_ms(started))
                raise
            except InternalError as e:
                log.error("vmi.error", error=str(e), dry_run=dry_run, duration_ms=_ms(started))
                raise
            log.info("vmi.admitted", node=node, dry_run=dry_run, duration_ms=_ms(started))
            return admitted

    @contextlib.contextmanager
    def _one_of(self, namespace: str) -> Iterator[None]:
        """Count an admission under way in the namespace, or refuse it when the namespace has its fill."""
        if self._under_way.get(namespace, 0) >= self._max_per_namespace:
            log.info("vmi.refused", reason="too many admissions under way", limit=self._max_per_namespace)
            raise Refusal(
                f"namespace {namespace} has {self._max_per_namespace} VMI admissions with GPUs under way, the most"
                " one namespace may have at once; KubeVirt retries the start"
            )
        self._under_way[namespace] = self._under_way.get(namespace, 0) + 1
        try:
            yield
        finally:
            self._under_way[namespace] -= 1
            if not self._under_way[namespace]:
                del self._under_way[namespace]

    async def _admit(
        self, vmi: dict[str, Any], name: str, namespace: str, dry_run: bool
    ) -> tuple[dict[str, Any], str | None]:
        if not name:
            raise Refusal("a VMI with GPU device references needs a name: generateName is not supported")
        try:
            refs = references.parse(vmi["metadata"].get("annotations"), self._max_devices)
        except references.ReferenceError as e:
            raise Refusal(str(e)) from None
        members = await self._resolve(namespace, name, refs, admission.controlling_vm(vmi))
        planned = plans.plan(
            self._cluster,
            vmi,
            namespace,
            members,
            output=self._output,
            prior=self._reservations.prior(),
            budgets_required=self._budgets_required,
        )
        if isinstance(planned, str):
            raise Refusal(planned)
        if dry_run:
            node = attach.already_placed(members, name, utcnow())
            return self._output.admitted(admission.marked(vmi), planned.entries, node), node
        # Checked: the orders count in the next admission's check until their devices are created.
        with self._reservations.holding(namespace, planned.orders):
            node = await self._bind(namespace, name, members)
        moved = admission.gathered(members, node)
        vm = admission.owner_vm(vmi)
        if moved and vm is not None and self._events is not None:
            # The VM is what the tenant looks at; each device's own Moved Event says the same per device.
            self._events.post_about(vm, "GPUsGathered", f"GPUs gathered on node {node}: " + ", ".join(moved))
        return self._output.admitted(admission.marked(vmi), planned.entries, node), node

    # -- §3.3, §3.4: fresh reads ---------------------------------------------

    async def _read(self, kind: kinds.Kind, namespace: str, name: str, tenant: str | None = None) -> Outcome:
        """A fresh read through the writer, so what it finds reaches the view too (issue 20 item 4)."""
        try:
            return await self._turns.call(tenant or namespace, self._writer.read, kind, name, namespace)
        except ApiError as e:
            raise InternalError(f"reading {kind.kind} {namespace}/{name}: {e.message}") from None

    async def _resolve(
        self, namespace: str, vmi: str, refs: list[references.Ref], vm: tuple[str, str] | None
    ) -> list[Member]:
        """§14.2, then §3.3 and §3.4, on one round of fresh reads: the VMI's name and every device at once, so
        an admission waits for one API answer, not two in a row (issue 22 item 4). Judged in the rules' order:
        a VMI of the name refuses the create whatever its devices are, even if reading them failed."""
        names = [r.name if isinstance(r, HeldRef) else template_device_name(vmi, i) for i, r in enumerate(refs)]
        # §9: a class created a moment before (one manifest) may not be in the view yet; read it fresh, not refuse.
        unseen = sorted({r.class_name for r in refs if isinstance(r, TemplateRef)} - set(self._cluster.classes))
        reads = [self._read(kinds.VMI, namespace, vmi), *(self._read(kinds.GPU_DEVICE, namespace, n) for n in names)]
        reads += [self._read(kinds.GPU_CLASS, "", c, namespace) for c in unseen]
        outcomes = await gather_outcomes(reads, self._calls_in_flight)
        if isinstance(outcomes[0], Outcome) and outcomes[0].body is not None:
            # §14.2: the API server answers AlreadyExists only after admission; whatever this call wrote would
            # stay, attaching devices to the running VMI and moving its set under its guest.
            raise Refusal(f"VMI {vmi} already exists in namespace {namespace}: a create of its name is not a new VMI")
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        devices = [_device(o.body) for o in outcomes[1 : 1 + len(names)] if isinstance(o, Outcome)]
        members: list[Member] = []
        problems: list[str] = []
        for index, (ref, device) in enumerate(zip(refs, devices, strict=True)):
            if isinstance(ref, TemplateRef):
                result = admission.check_template(self._cluster, namespace, vmi, index, ref=ref, device=device, vm=vm)
            else:
                result = admission.check_held(self._cluster, vmi, index, ref, device)
            if isinstance(result, str):
                problems.append(result)
            else:
                members.append(result)
        if problems:
            raise Refusal("; ".join(problems))
        return members

    # -- the bind (§4) --------------------------------------------------------

    async def _bind(self, namespace: str, vmi: str, members: list[Member]) -> str:
        writes = _Writes()
        try:
            members = await self._create_templates(members, writes)
            node = attach.already_placed(members, vmi, utcnow())
            if node is not None:
                return node  # a reinvocation: this create's own answer is in place
            request = BindRequest(
                id=str(uuid.uuid4()), vmi=vmi, devices=[m.device.name for m in members], requested_at=utcnow()
            )
            writes.request_id = request.id
            if not await self._answered_at_once(namespace, vmi, members, request, writes):
                # One status write per device, all at once: the binder answers once every one carries the id.
                await gather_bounded(
                    (self._request(m.device, vmi, request, writes) for m in members), self._calls_in_flight
                )
            match await self._wait(namespace, request):
                case attach.Bound(node):
                    log.info("vmi.bound", request_id=request.id, node=node, devices=request.devices)
                    return node
                case attach.Refused(message):
                    raise Refusal(message)
                case attach.Waiting():
                    raise Refusal(
                        f"the GPU binder did not answer within {self._bind_timeout:g}s; KubeVirt retries the start"
                    )
        except (Refusal, InternalError):
            await self._undo(namespace, vmi, writes)
            raise
        except ApiError as e:
            await self._undo(namespace, vmi, writes)
            raise InternalError(e.message) from None

    async def _create_templates(self, members: list[Member], writes: _Writes) -> list[Member]:
        """Create the set's new template devices, all at once; each one made is recorded for the undo."""

        async def create(m: Member) -> Member:
            if not m.create:
                return m
            outcome = await self._turns.call(
                m.device.namespace or "", self._writer.create, kinds.GPU_DEVICE, m.device.wire()
            )
            if not outcome.written or outcome.body is None:  # the name is taken (or was, a moment ago)
                raise Refusal(f"GPUDevice {m.device.name} was created by another admission at the same time")
            created = GPUDevice.from_wire(outcome.body)
            writes.created.append(created)
            return Member(created, m.cls, m.index, template=True, create=False)

        return await gather_bounded((create(m) for m in members), self._calls_in_flight)

    async def _request(self, device: GPUDevice, vmi: str, request: BindRequest, writes: _Writes) -> None:
        """Attach and write the request in one status update, under the device's resourceVersion."""
        namespace = device.namespace or ""
        attaching = False

        async def decide(body: Body | None) -> Step:
            nonlocal attaching
            current = _device(body)
            refusal = attach.refusal(current, device.name, vmi)
            if refusal is not None:
                raise Refusal(refusal)
            assert current is not None  # a device gone is a refusal
            earlier = attach.earlier_vmi(current)  # only then is the API asked: the view may lag a restart
            gone = earlier is not None and not await self._vmi_exists(namespace, vmi, earlier)
            step = attach.requested(current, vmi, request, utcnow(), earlier_gone=gone)
            attaching = step.attaching
            return self._write(namespace, self._writer.replace_status, kinds.GPU_DEVICE, step.device.wire())

        if not (await self._writer.update(device.wire(), decide)).written:
            raise Refusal(f"GPUDevice {device.name} kept changing while being attached; KubeVirt retries the start")
        writes.requested.append(device.name)
        if attaching:
            writes.attached.append(device.name)

    async def _answered_at_once(
        self, namespace: str, vmi: str, members: list[Member], request: BindRequest, writes: _Writes
    ) -> bool:
        """§4 in one write per device where this replica's binder decides (§13.4): the request built on the
        versions this call read or created, answered by the binder in the same write. False, with nothing
        written, when the binder leaves it to the protocol (then the request is written and answered as ever);
        a refusal when the answer landed on part of the set only (its undo takes that back)."""
        if self._answer is None:
            return False
        steps: list[attach.Attach] = []
        for m in members:
            if attach.refusal(m.device, m.device.name, vmi) is not None:
                return False  # refused by the protocol's own write, which reads it fresh
            earlier = attach.earlier_vmi(m.device)
            gone = earlier is not None and not await self._vmi_exists(namespace, vmi, earlier)
            steps.append(attach.requested(m.device, vmi, request, utcnow(), earlier_gone=gone))
        landed = await self._answer(namespace, [step.device for step in steps], request)
        if landed is None:
            return False
        for step in steps:
            if landed.get(step.device.name) is True:
                writes.requested.append(step.device.name)
                if step.attaching:
                    writes.attached.append(step.device.name)
        for failure in landed.values():
            if isinstance(failure, BaseException):
                raise failure  # the API failed a write: an error, after the undo of what did land (`_bind`)
        if not writes.requested:
            return False  # nothing landed (another writer first): the protocol's writes decide on a fresh read
        if len(writes.requested) != len(steps):
            changed = ", ".join(s.device.name for s in steps if landed.get(s.device.name) is not True)
            raise Refusal(f"GPUDevice {changed} changed while being attached; KubeVirt retries the start")
        return True

    def _write(self, namespace: str, call: Callable[P, Awaitable[Outcome]], *args: P.args, **kwargs: P.kwargs) -> Step:
        """A write of this admission, made in the namespace's turn (issue 34 item 6)."""
        return lambda: self._turns.call(namespace, call, *args, **kwargs)

    async def _vmi_exists(self, namespace: str, name: str, uid: str) -> bool:
        """Whether the VMI object of `uid` still has the name, read fresh: the view may lag its deletion."""
        body = (await self._read(kinds.VMI, namespace, name)).body
        return body is not None and body.get("metadata", {}).get("uid") == uid

    async def _wait(self, namespace: str, request: BindRequest) -> attach.Verdict:
        """The binder's answer once every device carries it, waking on view changes; still Waiting at the bind
        timeout."""
        deadline = time.monotonic() + self._bind_timeout
        with self._waiters.waiting((namespace, n) for n in request.devices) as changed:
            while True:
                changed.clear()
                verdict = attach.verdict(self._cluster, namespace, request)
                if not isinstance(verdict, attach.Waiting):
                    return verdict
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return verdict
                with contextlib.suppress(TimeoutError):  # not wait_for: on 3.11 it can swallow a cancel
                    async with asyncio.timeout(remaining):
                        await changed.wait()

    async def _undo(self, namespace: str, vmi: str, writes: _Writes) -> None:
        """Clear this call's request and attachments, delete the devices it created (UID precondition)."""
        created = {d.name for d in writes.created}
        try:
            async with asyncio.timeout(UNDO_TIMEOUT):
                await gather_bounded(
                    (
                        self._clear(namespace, name, vmi, writes.request_id, name in writes.attached)
                        for name in writes.requested
                        if name not in created
                    ),
                    self._calls_in_flight,
                )
                await gather_bounded(
                    (self._delete_created(namespace, d, writes.request_id) for d in writes.created),
                    self._calls_in_flight,
                )
        except (ApiError, InternalError, TimeoutError) as e:
            # What is left, the garbage collector clears after the grace period (§6.3).
            log.warning("vmi.undo.incomplete", error=str(e), request_id=writes.request_id)

    async def _delete_created(self, namespace: str, created: GPUDevice, request_id: str) -> None:
        """Delete a template device this call made, unless a concurrent create of the same VMI name took it
        over (issue 12 item 7); read fresh and deleted under its resourceVersion, so a takeover racing the
        delete makes it fail and decide again."""

        async def decide(body: Body | None) -> Step | None:
            current = _device(body)
            if current is None or current.metadata.uid != created.metadata.uid:
                return None
            if attach.taken_over(current, request_id):
                log.info("vmi.undo.left", device=created.name, request_id=request_id)
                return None
            rv = current.metadata.resource_version
            delete = self._writer.delete
            return self._write(
                namespace,
                delete,
                kinds.GPU_DEVICE,
                created.name,
                namespace,
                uid=created.metadata.uid,
                resource_version=rv,
            )

        outcome = await self._writer.update(await self._body(namespace, created.name), decide)
        if outcome.state is State.CONFLICT:
            # Written to all the while: what is left, the garbage collector clears after the grace period (§6.3).
            log.warning("vmi.undo.incomplete", device=created.name, error="it kept changing", request_id=request_id)
            return
        if outcome.state is State.LANDED:  # GONE: gone already, with no finalizer to release
            await self._release(namespace, created)
        if outcome.state is not State.CURRENT:
            log.info("vmi.undo.deleted", device=created.name)

    async def _release(self, namespace: str, created: GPUDevice) -> None:
        """Drop the in-use finalizer from a template device this call deleted: the collector may have added it
        meanwhile (it records the VMI of the name that names it, which may be another call's), and would keep it."""

        async def decide(body: Body | None) -> Step | None:
            current = _device(body)
            if current is None or current.metadata.uid != created.metadata.uid:
                return None
            if FINALIZER_IN_USE not in current.metadata.finalizers:
                return None
            kept = lifecycle.protected(current.metadata.finalizers, protect=False)
            patch = {"metadata": {"resourceVersion": current.metadata.resource_version, "finalizers": kept}}
            return self._write(namespace, self._writer.patch, kinds.GPU_DEVICE, created.name, namespace, patch)

        await self._writer.update(await self._body(namespace, created.name), decide)

    async def _clear(self, namespace: str, name: str, vmi: str, request_id: str, attached_by_us: bool) -> None:
        async def decide(body: Body | None) -> Step | None:
            current = _device(body)
            undone = attach.undone(current, vmi, request_id, attached_by_us) if current is not None else None
            if undone is None:
                return None
            return self._write(namespace, self._writer.replace_status, kinds.GPU_DEVICE, undone.wire())

        if (await self._writer.update(await self._body(namespace, name), decide)).written:
            log.info("vmi.undo.cleared", device=name, request_id=request_id)

    async def _body(self, namespace: str, name: str) -> Body | None:
        return (await self._read(kinds.GPU_DEVICE, namespace, name)).body


def _device(body: dict[str, Any] | None) -> GPUDevice | None:
    return GPUDevice.from_wire(body) if body is not None else None


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)
