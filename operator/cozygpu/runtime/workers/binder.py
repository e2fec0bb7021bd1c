"""The binder (§4, §5): the one writer of phase, nodeName and bindRequest.result.

One task decides one thing at a time from the cluster view, so two decisions never
spend the same free unit; each decision counts in the view at once (assumed) and is
written in the background through the one writer (runtime.writes). Woken by the
view's changes (`changed`); it never polls the API.

Why one module: the decision loop, its waiting room and its write slots share the pass's state;
issue 35 item 1 makes the binder a package with the queue and the dispatcher apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import heapq
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import structlog

from cozygpu.api import GPUDevice, kinds
from cozygpu.api.meta import now as utcnow
from cozygpu.decisions import transitions
from cozygpu.decisions.budgets import Order
from cozygpu.decisions.placement import Placement, place
from cozygpu.decisions.requests import Answer, Assessment, Wait, assess
from cozygpu.decisions.waiting import fits_now, in_turn, lost, must_decide, oldest, overtakes, to_decide
from cozygpu.runtime.events import Recorder
from cozygpu.runtime.ledger import Claim, Ledger
from cozygpu.runtime.metrics import Metrics
from cozygpu.runtime.workers import reports
from cozygpu.runtime.workers.mover import Mover
from cozygpu.runtime.workers.orders import Confirmations
from cozygpu.runtime.writes import Writer
from cozygpu.state.cluster import Change, Cluster, DeviceKey

log = structlog.get_logger("cozygpu.binder")

# A pass hands the event loop back at least this often (§14.3): probes, watches and admissions go on.
YIELD_EVERY = 0.002


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
        ledger: Ledger | None = None,
        idle_moves: int = 0,
        idle_after: float = 0.0,
    ) -> None:
        """`ledger`: where the binds that add use under a budget are confirmed across replicas (None: one replica);
        `idle_moves`, `idle_after`: how many idle devices one placement may move, idle how long (§5.7; 0: never);
        `guarded`: the no-bypass policy is in force, so new units go only to devices of ready classes (§12.3)."""
        self._cluster = cluster
        self._writer = writer
        self._incomplete_after = dt.timedelta(seconds=incomplete_after)
        self._clock = clock
        self._reserved = reserved
        self._budgets_required = budgets_required
        self._guarded = guarded
        self._events = events
        self._metrics = metrics
        self._wake = asyncio.Event()
        # It hears the view's changes once it has run (on the Lease holder, §10): a standby's binder hears nothing,
        # and its first pass on taking the Lease decides everything the view holds.
        self._listening = False
        # What the next pass decides (`waiting.to_decide`): devices with events since the last pass,
        # classes that gained room, classes whose serving nodes changed; everything on the first pass.
        self._fresh: set[DeviceKey] = set()
        self._room: set[str] = set()
        self._served: set[str] = set()
        self._first = True
        # What a pass that stepped aside had left, in turn; the classes it found no room for so far.
        self._rest: list[GPUDevice] = []
        self._passed_over: set[str] = set()
        # A bind request arrived: its admission waits, so the waiting room steps aside (§14.3).
        self._asked = False
        self._yielded = time.monotonic()
        # Writes in flight, bounded so decisions never run far ahead of the API, and to half the
        # client's pool: admissions, the accountant and the collector get the other half.
        self._in_flight = asyncio.Semaphore(max(1, concurrency // 2))
        self._writes: set[asyncio.Task[None]] = set()
        self._confirmations = (
            Confirmations(cluster, writer, ledger, reserved, self._gained) if ledger is not None else None
        )
        self.mover = Mover(
            cluster,
            writer,
            limit=idle_moves,
            clock=clock,
            events=events,
            metrics=metrics,
            gained=self._gained,
            idle_after=idle_after,
            spawn=self._spawn,
            again=self._again,
        )
        self._reach: set[str] = set()  # classes where idle moves may make room now (§5.7): their oldest retries

    def poke(self) -> None:
        self._wake.set()

    def listen(self) -> None:
        """Hear the view's changes from now on: `run` does, so only the Lease holder's binder hears them (§10)."""
        self._listening = True

    def changed(self, change: Change) -> None:
        """A change in the view: a device may be new in the waiting room or carry a request, a class may have
        gained room or serving nodes; only what it names is decided again, and a change that names none of
        these (a VMI's status, a node's heartbeat, a budget) does not wake the binder at all."""
        if not self._listening:
            return
        reach = self.mover.heard(change.reach)
        self._reach |= reach
        if not (change.room or change.served or reach or (change.kind is kinds.GPU_DEVICE and not change.deleted)):
            return
        if change.kind is kinds.GPU_DEVICE and not change.deleted:
            key = (change.namespace, change.name)
            self._fresh.add(key)
            device = self._cluster.device(*key)
            if device is not None and device.open_request is not None:
                self._asked = True
        self._room |= change.room
        self._served |= change.served
        self._wake.set()

    def _again(self, keys: frozenset[DeviceKey]) -> None:
        self._fresh |= keys
        self._wake.set()

    def _gained(self, room: frozenset[str]) -> None:
        """A bind taken back (runtime.workers.orders) left room on its node."""
        self._room |= room
        self._wake.set()

    async def _breathe(self) -> None:
        """Hand the event loop back when this task has held it for YIELD_EVERY."""
        if time.monotonic() - self._yielded >= YIELD_EVERY:
            await asyncio.sleep(0)
            self._yielded = time.monotonic()

    async def run(self) -> None:
        """Decide until cancelled; called once the cluster view has synced. Cancelling it cancels
        the writes in flight too: a replica that lost the Lease must stop writing at once (§10)."""
        self.listen()
        try:
            while True:
                self._wake.clear()
                try:
                    waiting = await self.step()
                except Exception:
                    log.exception("binder.step_failed")
                    waiting = True
                timeout = self.mover.sooner(0.5 if waiting else None)
                await asyncio.sleep(0)  # the writes a pass spawned run before the next, even if it woke itself
                with contextlib.suppress(TimeoutError):  # not wait_for: on 3.11 it can swallow a cancel
                    async with asyncio.timeout(timeout):
                        await self._wake.wait()
        finally:
            writes = list(self._writes)
            for task in writes:
                task.cancel()
            await asyncio.gather(*writes, return_exceptions=True)
            if self._confirmations is not None:
                await self._confirmations.close()

    async def step(self) -> bool:
        """One pass over everything undecided; True when a request is still being written."""
        self._yielded = time.monotonic()
        self._reach |= self.mover.ripe()  # here, so a step that fails before the waiting room cannot spin on it
        await self._writer.recheck()
        self._asked = False
        waiting = await self._answer_requests() or self._writer.doubtful
        await self._mark_lost()
        await self._place_waiting()
        return waiting

    # -- bind requests (§4) --------------------------------------------------

    async def _answer_requests(self) -> bool:
        waiting = False
        ids = self._cluster.open_request_ids()
        ids.sort(key=self._requested_at)
        for request_id in ids:
            await self._breathe()
            if any(self._cluster.assumed(*d.key) for d in self._cluster.devices_of_request(request_id)):
                waiting = True  # a write of ours on one of its devices is still out: decide after it
                continue
            # The slot first: nothing may change between the decision and its assumption in the view.
            await self._in_flight.acquire()
            assessment = self._assess(request_id)
            if isinstance(assessment, Answer) and self.mover.make_room(
                assessment.devices, assessment.outcome, asked=True
            ):
                self._in_flight.release()  # §5.7: decided once the moves made for it are written
                waiting = True
                continue
            if isinstance(assessment, Answer):
                self._answer(assessment)
                continue
            self._in_flight.release()
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
        for d in self._cluster.devices_of_request(request_id):
            if d.status.bind_request is not None:
                return d.status.bind_request.requested_at
        return self._clock()

    def _answer(self, answer: Answer) -> None:
        """Count the answer in the view at once and write it to every device of the set concurrently,
        in the background: the next request is decided meanwhile, on a view that already has this one.
        The caller holds a slot; the write gives it back."""
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
            self._room |= assumption.room  # a gather left room on the nodes it moved devices off
        orders = self._confirmations.orders_of(answer) if self._confirmations is not None else {}
        self._spawn(self._write_answer(answer, news, tokens, time.monotonic(), orders))

    def _spawn(self, write: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(write)
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _write_answer(
        self,
        answer: Answer,
        news: list[GPUDevice],
        tokens: list[int],
        started: float,
        orders: dict[Claim, Order] | None = None,
    ) -> None:
        try:
            if orders and self._confirmations is not None:
                answer, news, tokens = await self._confirmations.confirmed(answer, news, tokens, orders)
            request = answer.request
            results = await asyncio.gather(
                *(self._write(new, token=t) for new, t in zip(news, tokens, strict=True)), return_exceptions=True
            )
        finally:
            self._in_flight.release()
        written = [r is True for r in results]
        for failure in (r for r in results if isinstance(r, BaseException)):
            log.warning("binder.write_failed", request_id=request.id, namespace=answer.namespace, error=str(failure))
        if not all(written):
            # Someone wrote first; the view holds their version and the next pass decides again.
            lost = [d.name for d, ok in zip(answer.devices, written, strict=True) if not ok]
            log.info("bind.retry", request_id=request.id, namespace=answer.namespace, devices=lost)
            self.poke()
            return
        reports.answered(answer, self._events, self._metrics, self._clock(), started)

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
        if self._first:
            self._first = False
            musts, room = in_turn(self._cluster), set()  # the order the view keeps: no sort of every device
        else:
            musts = must_decide(self._cluster, self._served, self._fresh | oldest(self._cluster, self._reach))
            if self._rest:
                musts = list(heapq.merge(self._rest, musts, key=self._cluster.turn))
            room = self._room - self._served
        self._fresh, self._room, self._served, self._reach, self._rest = set(), set(), set(), set(), []
        self._passed_over.clear()
        decided, at, for_room = 0, 0, False
        try:
            for device, for_room in to_decide(self._cluster, musts, room):
                if not for_room:
                    at += 1
                await self._breathe()
                if for_room and not fits_now(self._cluster, device):
                    continue  # room it was woken for went to an older device: no decision, no scan
                # Each pass decides one device at least, so admissions arriving without end starve nothing.
                aside = decided > 0 and self._stepping_aside()
                if aside or not await self._decide(device, may_step_aside=decided > 0):
                    self._keep(musts, at, for_room, room)
                    return
                decided += 1
        except BaseException:
            self._keep(musts, at, for_room, room)  # what failed or was cancelled is decided again, not lost
            raise

    def _keep(self, musts: list[GPUDevice], at: int, for_room: bool, room: set[str]) -> None:
        """What a pass had left (from the device it stopped at), for the next pass, first."""
        self._rest = musts[max(at - 1, 0) :] if not for_room else musts[at:]
        self._room |= room
        self._wake.set()

    def _stepping_aside(self) -> bool:
        """A request waits for its answer, or room appeared that a device passed over in this pass could use."""
        return self._asked or not self._room.isdisjoint(self._passed_over)

    async def _decide(self, device: GPUDevice, *, may_step_aside: bool) -> bool:
        """Place one waiting device or say why it waits; False when it stepped aside before deciding."""
        key = device.key
        current = self._cluster.device(*key)
        if current is None or self._cluster.assumed(*key) or not current.awaits_node:
            return True
        # The slot first: nothing may change between the decision and its assumption in the view.
        await self._in_flight.acquire()
        if may_step_aside and self._stepping_aside():
            self._in_flight.release()
            return False
        current = self._cluster.device(*key)
        if current is None or self._cluster.assumed(*key) or not current.awaits_node:
            self._in_flight.release()
            return True
        if overtakes(self._cluster, current):
            # Room appeared mid-pass that an older device of the class fits in: it goes first (§5.5).
            self._in_flight.release()
            self._room.add(current.spec.class_name)
            return False
        outcome = place(self._cluster, [current], guarded=self._guarded)
        if self.mover.make_room([current], outcome, asked=False):
            self._in_flight.release()  # §5.7: decided again once the moves made for it are written
            return True
        if self._metrics is not None:
            self._metrics.decisions.labels("Bound" if isinstance(outcome, Placement) else "Pending").inc()
        if isinstance(outcome, Placement):
            bound = transitions.bound(current, outcome.node, self._clock())
            assumption = self._writer.assume(bound)
            self._room |= assumption.room
            self._spawn(self._bind(current, bound, outcome.node, assumption.token))
            return True
        self._in_flight.release()
        self._passed_over.add(current.spec.class_name)
        new = transitions.waiting(current, outcome.message, self._clock())
        try:
            if new != current and not await self._write(new):
                return True
        except Exception as e:  # the API failed us: decided again on the next pass, the pass goes on
            log.warning("binder.write_failed", namespace=key[0], device=key[1], error=str(e))
            self._fresh.add(key)
            self._wake.set()
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
        finally:
            self._in_flight.release()
        self._fresh.add(bound.key)
        self._wake.set()

    # -- writes ----------------------------------------------------------------

    def _post(self, device: GPUDevice, reason: str, message: str) -> None:
        if self._events is not None:
            self._events.post(device, reason, message)

    async def _write(self, device: GPUDevice, *, token: int | None = None) -> bool:
        """Replace the device's status under its resourceVersion; False when someone wrote first (the view
        holds their version then). `token`: the view already counts this write (`Writer.assume`)."""
        outcome = await self._writer.replace_status(kinds.GPU_DEVICE, device.wire(), assumption=token)
        return outcome.written
