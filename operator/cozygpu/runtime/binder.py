"""The binder (§4, §5): the one writer of phase, nodeName and bindRequest.result.

One task decides one thing at a time from the cluster view, so two decisions never
spend the same free unit; each decision counts in the view at once (assumed) and is
written in the background through the one writer (runtime.writes). Woken by the
view's changes (`changed`); it never polls the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import structlog

from cozygpu.api import GPUDevice, kinds
from cozygpu.api.meta import now as utcnow
from cozygpu.decisions import transitions
from cozygpu.decisions.budgets import Order
from cozygpu.decisions.placement import NoPlacement, Placement, place
from cozygpu.decisions.requests import Answer, Wait, assess
from cozygpu.decisions.waiting import in_turn, lost, placeable
from cozygpu.runtime.events import Recorder
from cozygpu.runtime.metrics import Metrics
from cozygpu.runtime.writes import Writer
from cozygpu.state.cluster import Change, Cluster, DeviceKey

log = structlog.get_logger("cozygpu.binder")


def _key(device: GPUDevice) -> DeviceKey:
    return (device.namespace or "", device.name)


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
        events: Recorder | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._cluster = cluster
        self._writer = writer
        self._incomplete_after = dt.timedelta(seconds=incomplete_after)
        self._clock = clock
        self._reserved = reserved
        self._events = events
        self._metrics = metrics
        self._wake = asyncio.Event()
        # Capacity generation at a device's last failed placement: retry only when it moves.
        self._tried_at: dict[DeviceKey, int] = {}
        # Devices with events since the last pass, and the generation of the last full pass.
        self._fresh: set[DeviceKey] = set()
        self._passed_at = -1
        # Writes in flight, bounded so decisions never run far ahead of the API, and to half the
        # client's pool: admissions, the accountant and the collector get the other half.
        self._in_flight = asyncio.Semaphore(max(1, concurrency // 2))
        self._writes: set[asyncio.Task[None]] = set()

    def poke(self) -> None:
        self._wake.set()

    def changed(self, change: Change) -> None:
        """A change in the view: a device may be new in the waiting room (decided on the next pass without a
        full one), and anything may free room or answer a request."""
        if change.kind == "GPUDevice" and not change.deleted:
            self._fresh.add((change.namespace, change.name))
        self._wake.set()

    async def run(self) -> None:
        """Decide until cancelled; called once the cluster view has synced. Cancelling it cancels
        the writes in flight too: a replica that lost the Lease must stop writing at once (§10)."""
        try:
            while True:
                self._wake.clear()
                try:
                    waiting = await self.step()
                except Exception:
                    log.exception("binder.step_failed")
                    waiting = True
                timeout = 0.5 if waiting else None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
        finally:
            writes = list(self._writes)
            for task in writes:
                task.cancel()
            await asyncio.gather(*writes, return_exceptions=True)

    async def step(self) -> bool:
        """One pass over everything undecided; True when a request is still being written."""
        await self._writer.recheck()
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
            if any(self._cluster.assumed(*_key(d)) for d in self._cluster.devices_of_request(request_id)):
                waiting = True  # a write of ours on one of its devices is still out: decide after it
                continue
            # The slot first: nothing may change between the decision and its assumption in the view.
            await self._in_flight.acquire()
            assessment = assess(self._cluster, request_id, self._clock(), self._incomplete_after, self._reserved())
            if isinstance(assessment, Answer):
                self._answer(assessment)
                continue
            self._in_flight.release()
            waiting = waiting or isinstance(assessment, Wait)
        return waiting

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
        tokens = [self._cluster.assume_device(new) for new in news]
        self._spawn(self._write_answer(answer, news, tokens, time.monotonic()))

    def _spawn(self, write: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(write)
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _write_answer(self, answer: Answer, news: list[GPUDevice], tokens: list[int], started: float) -> None:
        outcome, request = answer.outcome, answer.request
        try:
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
        for device in answer.devices:
            if isinstance(outcome, NoPlacement):
                self._post(device, "Failed", f"VMI {request.vmi}: {outcome.message}")
            elif device.holds_gpus and device.status.node_name != outcome.node:
                self._post(
                    device,
                    "Moved",
                    f"moved from node {device.status.node_name} to {outcome.node} for VMI {request.vmi}",
                )
            elif not device.holds_gpus:
                self._post(device, "Bound", f"bound on node {outcome.node} for VMI {request.vmi}")
        placed = isinstance(outcome, Placement)
        if self._metrics is not None:
            waited = max(0.0, (self._clock() - request.requested_at).total_seconds())
            self._metrics.bind.labels("Succeeded" if placed else "Failed").observe(waited)
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
            duration_ms=round((time.monotonic() - started) * 1000, 1),
        )

    # -- devices outside requests (§5.5, §5.6) -------------------------------

    async def _mark_lost(self) -> None:
        """§5.6: devices Bound to a node the view does not have turn Lost.

        Derived from the view on every pass, not from the deletion event: a Lost write that
        lost a conflict (the collector writing the same device) is simply tried again."""
        for device, node in list(lost(self._cluster)):
            why = f"node {node} is gone"
            if await self._write(transitions.lost(device, why, self._clock())):
                log.info("device.lost", namespace=device.namespace, device=device.name, node=node)
                self._post(device, "Lost", why)

    async def _place_waiting(self) -> None:
        """§5.5 first come first served, with the writes pipelined (§13.1).

        While capacity has not grown, a device that found no room still finds none, so a pass
        decides only devices that are new since the last one; when capacity grew, every waiting
        device, oldest first. Each decision is counted in the view at once (assumed) and written
        in the background, up to the API concurrency; a write that fails puts the device back
        in the view as the API has it, and it is decided again."""
        generation = self._cluster.capacity_generation
        if generation != self._passed_at:
            self._passed_at = generation
            self._fresh.clear()
            waiting = in_turn(self._cluster)  # the order the view keeps: no sort of every waiting device
            live = {_key(d) for d in waiting}
            self._tried_at = {k: g for k, g in self._tried_at.items() if k in live}
        else:
            fresh, self._fresh = self._fresh, set()
            news = [d for k in fresh if (d := self._cluster.device(*k)) is not None and not d.holds_gpus]
            waiting = in_turn(self._cluster, news)
        for device in waiting:
            if self._cluster.capacity_generation != generation:
                # Room appeared while a write yielded: oldest first again, or a newer device takes it.
                self._wake.set()
                return
            await self._decide(device, generation)

    async def _decide(self, device: GPUDevice, generation: int) -> None:
        key = _key(device)
        current = self._cluster.device(*key)
        if current is None or self._cluster.assumed(*key) or not placeable(current):
            return
        if current.status.phase is not None and self._tried_at.get(key) == generation:
            return
        # The slot first: nothing may change between the decision and its assumption in the view.
        await self._in_flight.acquire()
        current = self._cluster.device(*key)
        stale = self._cluster.capacity_generation != generation  # room appeared: the oldest decide first
        if stale or current is None or self._cluster.assumed(*key) or not placeable(current):
            self._in_flight.release()
            return
        outcome = place(self._cluster, [current])
        if isinstance(outcome, Placement):
            self._tried_at.pop(key, None)
            bound = transitions.bound(current, outcome.node, self._clock())
            token = self._cluster.assume_device(bound)
            self._spawn(self._bind(current, bound, outcome.node, token))
            return
        self._in_flight.release()
        new = transitions.waiting(current, outcome.message, self._clock())
        if new != current and not await self._write(new):
            return
        self._tried_at[key] = generation
        if current.status.phase is None or current.status.message != new.status.message:
            log.info("device.waiting", namespace=key[0], device=key[1], message=new.status.message)

    async def _bind(self, before: GPUDevice, bound: GPUDevice, node: str, token: int) -> None:
        """The write of one assumed decision; its slot is given back when it is done."""
        try:
            if await self._write(bound, token=token):
                self._post(bound, "Bound", f"bound on node {node}")
                log.info("device.bound", namespace=bound.namespace, device=bound.name, node=node,
                         phase_was=str(before.status.phase))  # fmt: skip
                return
        except Exception as e:  # the API failed us: the device is decided again on the next pass
            log.warning("binder.write_failed", namespace=bound.namespace, device=bound.name, error=str(e))
        finally:
            self._in_flight.release()
        self._fresh.add(_key(bound))
        self._wake.set()

    # -- writes ----------------------------------------------------------------

    def _post(self, device: GPUDevice, reason: str, message: str) -> None:
        if self._events is not None:
            self._events.post(device, reason, message)

    async def _write(self, device: GPUDevice, *, token: int | None = None) -> bool:
        """Replace the device's status under its resourceVersion; False when someone wrote first (the view
        holds their version then). `token`: the view already counts this write (`Cluster.assume_device`)."""
        outcome = await self._writer.replace_status(kinds.GPU_DEVICE, device.wire(), assumption=token)
        return outcome.written
