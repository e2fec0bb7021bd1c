"""The binder's decision loop (§4, §5): bind requests first, then devices Bound to a gone node, then the waiting
room, one decision at a time from the view.

Each pass takes its work from the waiting room (runtime.workers.binder.queue), decides, counts each decision in
the view at once (`Writer.assume`) and hands its write to a slot of the dispatcher
(runtime.workers.binder.dispatcher), so the next decision is made on a view that has this one while the write is
under way. Called by the Operator (`run`, on the Lease holder), this process's VMI webhook (`answer_at_once`,
a request answered in its own write) and tests (`step`).

Why one module: requests, the waiting room's devices and the Lost marks are decided in one order on one view,
each under a slot of the same dispatcher; the order is the pass, and the pass is this loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import structlog

from cozygpu.api import BindRequest, GPUDevice, kinds
from cozygpu.api.meta import now as utcnow
from cozygpu.decisions import transitions
from cozygpu.decisions.orders import Order
from cozygpu.decisions.placement import Placement, place
from cozygpu.decisions.requests import Answer, Assessment, Wait, assess, judge
from cozygpu.decisions.waiting import fits_now, lost, overtakes, to_decide
from cozygpu.runtime.breath import Breath
from cozygpu.runtime.charges import Charges
from cozygpu.runtime.events import Recorder
from cozygpu.runtime.metrics import Metrics
from cozygpu.runtime.workers.binder import reports
from cozygpu.runtime.workers.binder.confirmations import Bind, Confirmations
from cozygpu.runtime.workers.binder.dispatcher import Dispatcher, Slot
from cozygpu.runtime.workers.binder.evacuator import Evacuator
from cozygpu.runtime.workers.binder.mover import Mover
from cozygpu.runtime.workers.binder.pacing import Pacing
from cozygpu.runtime.workers.binder.queue import WaitingRoom
from cozygpu.runtime.writes import Writer
from cozygpu.state.cluster import Change, Cluster

log = structlog.get_logger("cozygpu.binder")

# What an answer's write did on each device of the set, by name: True landed, False someone wrote first, or the
# API's failure.
Landed = dict[str, bool | BaseException]


class Binder:
    def __init__(
        self,
        cluster: Cluster,
        writer: Writer,
        *,
        incomplete_after: float,
        concurrency: int,
        clock: Callable[[], dt.datetime] = utcnow,
        reserved: Callable[[], Sequence[Order]] = tuple,
        budgets_required: bool = False,
        guarded: bool = False,
        events: Recorder | None = None,
        metrics: Metrics | None = None,
        charges: Charges | None = None,
        idle_moves: int = 0,
        idle_after: float = 0.0,
        evacuations_per_node: int = 2,
        evacuations: int = 5,
        stop_bare: bool = False,
    ) -> None:
        """`charges`: where the binds that add use under a budget are charged across replicas (None: one replica);
        `idle_moves`, `idle_after`: how many idle devices one placement may move, idle how long (§5.7; 0: never);
        `guarded`: the no-bypass policy is in force, so new units go only to devices of ready classes (§12.3);
        `evacuations_per_node`, `evacuations`, `stop_bare`: how node maintenance goes (§6.8)."""
        self._cluster = cluster
        self._writer = writer
        self._incomplete_after = dt.timedelta(seconds=incomplete_after)
        self._clock = clock
        self._reserved = reserved
        self._budgets_required = budgets_required
        self._guarded = guarded
        self._events = events
        self._metrics = metrics
        self._breathe = Breath()
        self.queue = WaitingRoom(cluster)
        # Writes in flight, bounded so decisions never run far ahead of the API, and to half the
        # client's pool: admissions, the accountant and the collector get the other half.
        self.dispatcher = Dispatcher(concurrency // 2)
        pacing = Pacing(evacuations_per_node, evacuations)
        self.mover = Mover(
            cluster,
            writer,
            self.queue,
            self.dispatcher,
            limit=idle_moves,
            clock=clock,
            events=events,
            metrics=metrics,
            idle_after=idle_after,
            pacing=pacing,
        )
        self.evacuator = Evacuator(
            cluster,
            writer,
            self.queue,
            self.dispatcher,
            pacing,
            clock=clock,
            events=events,
            metrics=metrics,
            stop_bare=stop_bare,
        )
        self._confirmations = (
            Confirmations(cluster, writer, charges, reserved, self.queue) if charges is not None else None
        )

    def poke(self) -> None:
        self.queue.poke()

    def listen(self) -> None:
        """Hear the view's changes from now on: `run` does, so only the Lease holder's binder hears them (§10)."""
        self.queue.listen()

    def changed(self, change: Change) -> None:
        """A change in the view, for the waiting room, with what the mover says of where room may be made; and for
        the mover and the evacuator, whether idle devices or VMs may leave a cordoned node now (§6.8)."""
        if not self.queue.listening:
            return  # a standby's binder: its first pass on taking the Lease decides everything (§10)
        self.queue.changed(change, self.mover.heard(change.reach))
        if (change.nodes or change.room) and self.mover.heard_nodes(change.nodes, change.room):
            self.queue.poke()
        if self.evacuator.heard(change):
            self.queue.poke()

    async def run(self) -> None:
        """Decide until cancelled; called once the cluster view has synced. Cancelling it cancels
        the writes in flight too: a replica that lost the Lease must stop writing at once (§10)."""
        self.listen()
        try:
            while True:
                self.queue.wake.clear()
                try:
                    waiting = await self.step()
                except Exception:
                    log.exception("binder.step_failed")
                    waiting = True
                timeout = self.mover.sooner(0.5 if waiting else None)
                await asyncio.sleep(0)  # the writes a pass spawned run before the next, even if it woke itself
                with contextlib.suppress(TimeoutError):  # not wait_for: on 3.11 it can swallow a cancel
                    async with asyncio.timeout(timeout):
                        await self.queue.wake.wait()
        finally:
            await self.dispatcher.close()

    async def step(self) -> bool:
        """One pass over everything undecided; True when a request is still being written."""
        self._breathe.restart()
        self.queue.ripened(self.mover.ripe())  # here, so a step that fails before the waiting room cannot spin
        await self._writer.recheck()
        self.queue.asked = False
        waiting = await self._answer_requests() or self._writer.doubtful
        # After the requests: an order's answer comes before a move off a cordoned node; VMs before idle devices.
        self.evacuator.evacuate()
        self.mover.evacuate()
        await self._mark_lost()
        await self._place_waiting()
        return waiting

    # -- bind requests (§4) --------------------------------------------------

    async def _answer_requests(self) -> bool:
        waiting = False
        ids = self._cluster.devices.open_request_ids()
        ids.sort(key=self._requested_at)
        for request_id in ids:
            await self._breathe()
            if any(self._cluster.devices.assumed(*d.key) for d in self._cluster.devices.of_request(request_id)):
                waiting = True  # a write of ours on one of its devices is still out: decide after it
                continue
            # The slot first: nothing may change between the decision and its assumption in the view.
            async with self.dispatcher.slot() as slot:
                assessment = self._assess(request_id)
                if isinstance(assessment, Answer) and self.mover.make_room(
                    assessment.devices, assessment.outcome, asked=True
                ):
                    waiting = True  # §5.7: decided once the moves made for it are written
                elif isinstance(assessment, Answer):
                    self._answer(assessment, slot)
                else:
                    waiting = waiting or isinstance(assessment, Wait)
        return waiting

    def _assess(self, request_id: str) -> Assessment:
        return assess(
            self._cluster,
            request_id,
            self._clock(),
            self._incomplete_after,
            self._reserved(),
            budgets_required=self._budgets_required,
            guarded=self._guarded,
        )

    def _requested_at(self, request_id: str) -> dt.datetime:
        for d in self._cluster.devices.of_request(request_id):
            if d.status.bind_request is not None:
                return d.status.bind_request.requested_at
        return self._clock()

    async def answer_at_once(
        self, namespace: str, requested: Sequence[GPUDevice], request: BindRequest
    ) -> Landed | None:
        """§4 in one write per device (§13.4): the set as the webhook of this replica would write its request
        (`requested`, built on the versions it read), answered with that request, when this binder decides (the
        Lease holder's) and can place the set now. Returns what the write did on each device; None, with nothing
        written, when the binder leaves it to the protocol: not deciding here, a version of a device the view has
        moved past or a decision of its own in flight on one, an older request still open (answered first, in
        order), or an answer other than a placement (a refusal, a wait, idle moves to make room are the binder's
        to make on the written request, as for any other)."""
        if not self.queue.listening:
            return None
        async with self.dispatcher.slot() as slot:
            if self._cluster.devices.open_request_count():
                return None  # requests written before it are answered first, oldest first, by the pass
            for device in requested:
                held = self._cluster.devices.get(device.key)
                version = device.metadata.resource_version
                if (
                    held is None
                    or held.metadata.resource_version != version
                    or self._cluster.devices.assumed(*device.key)
                ):
                    return None
            answer = judge(
                self._cluster,
                request,
                namespace,
                tuple(requested),
                now=self._clock(),
                incomplete_after=self._incomplete_after,
                prior=self._reserved(),
                budgets_required=self._budgets_required,
                guarded=self._guarded,
            )
            if not isinstance(answer, Answer) or not isinstance(answer.outcome, Placement):
                return None
            done: asyncio.Future[Landed] = asyncio.get_running_loop().create_future()
            self._answer(answer, slot, done)
        return await done

    def _answer(self, answer: Answer, slot: Slot, done: asyncio.Future[Landed] | None = None) -> None:
        """Count the answer in the view at once and write it to every device of the set concurrently,
        in the background: the next request is decided meanwhile, on a view that already has this one.
        The decision's slot goes with the write; `done` learns what became of it on each device."""
        now = self._clock()
        outcome, request = answer.outcome, answer.request
        news = [
            transitions.bound(d, outcome.node, now, request.id)
            if isinstance(outcome, Placement)
            else transitions.refused(d, request.id, outcome.message)
            for d in answer.devices
        ]
        assumptions = [self._writer.assume(new) for new in news]
        tokens = [a.token for a in assumptions]
        for assumption in assumptions:
            self.queue.note_room(assumption.room)  # a gather left room on the nodes it moved devices off
        bind = self._confirmations.orders_of(answer) if self._confirmations is not None else None
        slot.hand(_telling(done, self._write_answer(answer, news, tokens, time.monotonic(), bind)))

    async def _write_answer(
        self,
        answer: Answer,
        news: list[GPUDevice],
        tokens: list[int],
        started: float,
        bind: Bind | None = None,
    ) -> Landed:
        """What became of the answer's write on each device."""
        if bind is not None and self._confirmations is not None:
            answer, news, tokens = await self._confirmations.confirmed(bind, news, tokens)
        request = answer.request
        results = await asyncio.gather(
            *(self._write(new, token=t) for new, t in zip(news, tokens, strict=True)), return_exceptions=True
        )
        landed: Landed = {
            d.name: r if isinstance(r, BaseException) else r is True
            for d, r in zip(answer.devices, results, strict=True)
        }
        for failure in (r for r in results if isinstance(r, BaseException)):
            log.warning("binder.write_failed", request_id=request.id, namespace=answer.namespace, error=str(failure))
        lost = [name for name, result in landed.items() if result is not True]
        if lost:
            # Someone wrote first; the view holds their version and the next pass decides again.
            log.info("bind.retry", request_id=request.id, namespace=answer.namespace, devices=lost)
            self.poke()
            return landed
        reports.answered(answer, self._events, self._metrics, self._clock(), started)
        return landed

    # -- devices outside requests (§5.5, §5.6) -------------------------------

    async def _mark_lost(self) -> None:
        """§5.6: devices Bound to a node the view does not have turn Lost.

        Derived from the view on every pass, not from the deletion event: a Lost write that
        lost a conflict (the collector writing the same device) is simply tried again."""
        for device, node in list(lost(self._cluster)):
            await self._breathe()
            why = f"node {node} is gone"
            try:
                written = await self._write(transitions.lost(device, why, self._clock()))
            except Exception as e:  # the API failed us on this one: the rest of the step goes on, it is tried again
                log.warning("binder.write_failed", namespace=device.namespace, device=device.name, error=str(e))
                continue
            if written:
                log.info("device.lost", namespace=device.namespace, device=device.name, node=node)
                self._post(device, "Lost", why)

    async def _place_waiting(self) -> None:
        """§5.5 first come first served, with the writes pipelined (§13.1).

        A pass decides what the events since the last one could change (`waiting.to_decide`): a device
        that found no room is not looked at again until room that fits it appears, so a backlog that
        cannot be placed costs nothing per event (§14.3). Each decision is counted in the view at once
        (assumed) and written in the background, up to the API concurrency; a write that fails puts the
        device back in the view as the API has it, and it is decided again. The pass steps aside for new
        bind requests, and for room that an older device it found no place for could use; what it had
        left is decided first on the next pass, in the order it had, without sorting it again."""
        musts, room = self.queue.next_pass()
        decided, at, for_room = 0, 0, False
        try:
            for device, for_room in to_decide(self._cluster, musts, room):
                if not for_room:
                    at += 1
                await self._breathe()
                if for_room and not fits_now(self._cluster, device):
                    continue  # room it was woken for went to an older device: no decision, no scan
                # Each pass decides one device at least, so admissions arriving without end starve nothing.
                aside = decided > 0 and self.queue.stepping_aside()
                if aside or not await self._decide(device, may_step_aside=decided > 0):
                    self.queue.keep(musts, at, for_room, room)
                    return
                decided += 1
        except BaseException:
            self.queue.keep(musts, at, for_room, room)  # what failed or was cancelled is decided again, not lost
            raise

    async def _decide(self, device: GPUDevice, *, may_step_aside: bool) -> bool:
        """Place one waiting device or say why it waits; False when it stepped aside before deciding."""
        key = device.key
        current = self._cluster.devices.get(key)
        if current is None or self._cluster.devices.assumed(*key) or not current.awaits_node:
            return True
        # The slot first: nothing may change between the decision and its assumption in the view.
        async with self.dispatcher.slot() as slot:
            if may_step_aside and self.queue.stepping_aside():
                return False
            current = self._cluster.devices.get(key)
            if current is None or self._cluster.devices.assumed(*key) or not current.awaits_node:
                return True
            if overtakes(self._cluster, current):
                # Room appeared mid-pass that an older device of the class fits in: it goes first (§5.5).
                self.queue.overtaken(current.spec.class_name)
                return False
            outcome = place(self._cluster, [current], guarded=self._guarded)
            if self.mover.make_room([current], outcome, asked=False):
                return True  # §5.7: decided again once the moves made for it are written
            if self._metrics is not None:
                self._metrics.decisions.labels("Bound" if isinstance(outcome, Placement) else "Pending").inc()
            if isinstance(outcome, Placement):
                bound = transitions.bound(current, outcome.node, self._clock())
                assumption = self._writer.assume(bound)
                self.queue.note_room(assumption.room)
                slot.hand(self._bind(current, bound, outcome.node, assumption.token))
                return True
        # No room: the slot is given back, and why it waits is written outside it.
        self.queue.passed_over(current.spec.class_name)
        new = transitions.waiting(current, outcome.message, self._clock())
        try:
            if new != current and not await self._write(new):
                return True
        except Exception as e:  # the API failed us: decided again on the next pass, the pass goes on
            log.warning("binder.write_failed", namespace=key[0], device=key[1], error=str(e))
            self.queue.again(frozenset({key}))
            return True
        if current.status.phase is None or current.status.message != new.status.message:
            log.info(
                "device.waiting", namespace=key[0], device=key[1], message=new.status.message, detail=outcome.detail
            )
        return True

    async def _bind(self, before: GPUDevice, bound: GPUDevice, node: str, token: int) -> None:
        """The write of one assumed decision; its slot is given back when it is done."""
        try:
            if await self._write(bound, token=token):
                self._post(bound, "Bound", f"bound on node {node}")
                log.info(
                    "device.bound",
                    namespace=bound.namespace,
                    device=bound.name,
                    node=node,
                    phase_was=str(before.status.phase),
                )
                return
        except Exception as e:  # the API failed us: the device is decided again on the next pass
            log.warning("binder.write_failed", namespace=bound.namespace, device=bound.name, error=str(e))
        self.queue.again(frozenset({bound.key}))

    # -- writes ----------------------------------------------------------------

    def _post(self, device: GPUDevice, reason: str, message: str) -> None:
        if self._events is not None:
            self._events.post(device, reason, message)

    async def _write(self, device: GPUDevice, *, token: int | None = None) -> bool:
        """Replace the device's status under its resourceVersion; False when someone wrote first (the view
        holds their version then). `token`: the view already counts this write (`Writer.assume`)."""
        outcome = await self._writer.replace_status(kinds.GPU_DEVICE, device.wire(), assumption=token)
        return outcome.written


async def _telling(done: asyncio.Future[Landed] | None, write: Coroutine[Any, Any, Landed]) -> None:
    """Run an answer's write; `done`, if any, learns its result (or that it failed or was cancelled)."""
    try:
        written = await write
    except BaseException as e:
        if done is not None and isinstance(e, asyncio.CancelledError):
            done.cancel()
        elif done is not None and not done.done():
            done.set_exception(e)
        raise
    if done is not None and not done.done():
        done.set_result(written)
