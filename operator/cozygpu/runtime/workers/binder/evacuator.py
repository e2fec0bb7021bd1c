"""Node maintenance (§6.8), carried out: the operator as KubeVirt's external evacuation controller for GPU VMs.

Called by the binder alone, on each pass (serialised with every placement), when something happened that may let
an evacuation go: a VMI marked or gone, a node cordoned, room for a set that found none. For each VMI of
`decisions.evacuation.marked`, the first marked first and paced with the mover's devices (`Pacing`), it takes
the next step `decisions.evacuation.decide` gives: the set's moves to the destination are counted in the view at
once (assumed) and written in the background, then the VMI is deleted under its uid so its VM starts the next
one, whose admission finds the set waiting on the destination. A VM that cannot leave keeps running; its
tenant gets an Event on each device of the set and the platform a log line, the GPUNode condition (the
accountant's) and the blocked gauge, and it is looked at again when room for its classes appears, never on a
timer. An evacuation is under way from its first write until the VMI object it started with is gone or its
launcher pod no longer holds units, whichever comes first; once the VMI is deleted it counts against its node's
limit only, not the cluster's (its guest stops in a time its tenant sets).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable
from typing import Any

from cozygpu.api import GPUDevice, kinds
from cozygpu.decisions import evacuation, nodestatus, transitions
from cozygpu.decisions.evacuation import Blocked, Evacuation, Reserve, Restart, Stop
from cozygpu.runtime.events import Recorder
from cozygpu.runtime.metrics import Metrics
from cozygpu.runtime.workers.binder import reports
from cozygpu.runtime.workers.binder.dispatcher import Dispatcher
from cozygpu.runtime.workers.binder.pacing import Pacing
from cozygpu.runtime.workers.binder.queue import WaitingRoom
from cozygpu.runtime.writes import State, Step, Writer
from cozygpu.state.cluster import Change, Cluster

VmiKey = tuple[str, str]
Body = dict[str, Any]


class Evacuator:
    def __init__(
        self,
        cluster: Cluster,
        writer: Writer,
        queue: WaitingRoom,
        dispatcher: Dispatcher,
        pacing: Pacing,
        *,
        clock: Callable[[], dt.datetime],
        events: Recorder | None = None,
        metrics: Metrics | None = None,
        stop_bare: bool = False,
    ) -> None:
        """`queue`: told of room the moves leave; `dispatcher`: runs the writes (cancelled with the binder);
        `pacing`: shared with the mover; `stop_bare`: whether a VMI no VM controls is stopped (else it stays)."""
        self._cluster = cluster
        self._writer = writer
        self._queue = queue
        self._dispatcher = dispatcher
        self._pacing = pacing
        self._clock = clock
        self._events = events
        self._metrics = metrics
        self._stop_bare = stop_bare
        self._under_way: dict[VmiKey, str] = {}  # the VMI objects (uid) whose evacuation is under way
        self._deleted: dict[VmiKey, str] = {}  # the VMI objects (uid) deleted, while the view still has them
        self._blocked: dict[VmiKey, str] = {}  # why each blocked one is, as last told
        self._stuck: set[str] = set()  # classes of blocked sets: room for them is worth a look
        self._due = True
        self.restarted = 0  # VMs restarted off nodes being drained since start, for the bench and tests

    def heard(self, change: Change) -> bool:
        """Whether the change makes an evacuation worth a look now: a VMI marked, or one under way or blocked that
        changed or went; a node cordoned or uncordoned; a KubeVirt CR; room for a blocked set's classes. Nothing
        else wakes it (§14.3), a VMI's status least of all."""
        was = self._due
        if change.kind is kinds.VMI:
            key = change.key
            uid = self._under_way.get(key)
            if uid is not None and self._cluster.vmis.get(key) != uid:
                self._release(key)  # the VMI it started with is gone: the next may go
            if key in self._deleted and self._cluster.vmis.get(key) != self._deleted[key]:
                del self._deleted[key]
            if self._cluster.vmis.mark_of(key) is not None or key in self._blocked:
                self._due = True
        elif change.kind is kinds.POD and change.guests_gone:
            # Its launcher no longer holds units: the node is rid of it, even if the VMI object lingers (a finalizer
            # a tenant added to her VMI would otherwise hold a pacing slot, and every drain behind it, for good).
            for key in change.guests_gone & self._under_way.keys():
                if not self._cluster.pods.guest_running(key[0], self._under_way[key]):
                    self._release(key)
        elif change.kind is kinds.KUBEVIRT or (change.kind is kinds.NODE and change.nodes):
            self._due = True  # a node cordoned or uncordoned, out of service or back, a strategy changed
        elif self._blocked and (change.room & self._stuck or change.served):
            self._due = True
        return self._due and not was

    def evacuate(self) -> None:
        """Take the next step of each evacuation that may go now, the first marked first (§6.8)."""
        if not self._due:
            return
        self._due = False
        stuck: set[str] = set()
        marked = evacuation.marked(self._cluster)
        for key in set(self._blocked) - {e.key for e in marked}:
            del self._blocked[key]  # unmarked, restarted or gone meanwhile
        for ev in marked:
            if ev.key in self._under_way or self._deleted.get(ev.key) == ev.uid:
                continue  # its writes are under way, or it is deleted already and lingers (a finalizer)
            step = evacuation.decide(self._cluster, ev, stop_bare=self._stop_bare)
            if isinstance(step, Blocked):
                stuck |= {d.spec.class_name for d in ev.devices}
                self._block(ev, step.reason)
                continue
            if self._pacing.room(ev.node) <= 0:
                continue  # the first marked go first; this one when one of them is done
            self._blocked.pop(ev.key, None)
            self._under_way[ev.key] = ev.uid
            self._pacing.start(("vmi", *ev.key), ev.node)
            if isinstance(step, Reserve):
                self._reserve(ev, step)
            else:
                self._dispatcher.spawn(self._delete(ev, step))
        self._stuck = stuck
        self._gauge()

    def _reserve(self, ev: Evacuation, step: Reserve) -> None:
        now = self._clock()
        news = [transitions.reserved(d, step.node, ev.node, now) for d in step.devices]
        tokens = []
        for new in news:
            assumption = self._writer.assume(new)  # counted on the destination at once (§13.1)
            tokens.append(assumption.token)
            self._queue.gained(assumption.room)
        reports.evacuating(ev, step)
        self._dispatcher.spawn(self._write_reserve(ev, step, news, tokens))

    async def _write_reserve(self, ev: Evacuation, step: Reserve, news: list[GPUDevice], tokens: list[int]) -> None:
        results = await asyncio.gather(
            *(
                self._writer.replace_status(kinds.GPU_DEVICE, n.wire(), assumption=t)
                for n, t in zip(news, tokens, strict=True)
            ),
            return_exceptions=True,
        )
        failed = [r for r in results if isinstance(r, BaseException) or not r.written]
        if failed:
            # Someone wrote one of them first (or the API failed us): decided again on the view as the API has it.
            reports.evacuation_failed(ev, next((r for r in failed if isinstance(r, BaseException)), None))
            self._count("Failed")
            self._finish(ev)
            return
        reports.reserved(ev, step, self._events)
        await self._delete(ev, Restart(step.node))

    async def _delete(self, ev: Evacuation, step: Restart | Stop) -> None:
        """Delete the VMI object the evacuation started with: its VM starts the next (Restart), or none does."""
        try:
            outcome = await self._writer.delete(kinds.VMI, ev.vmi, ev.namespace, uid=ev.uid)
        except Exception as e:  # the API failed us: decided again on the next look
            reports.evacuation_failed(ev, e)
            self._count("Failed")
            self._finish(ev)
            return
        if outcome.state is State.CONFLICT:  # another VMI of the name now: not the one marked
            self._finish(ev)
            return
        self._deleted[ev.key] = ev.uid
        restart = isinstance(step, Restart)
        self.restarted += restart
        self._count("Restarted" if restart else "Stopped")
        reports.evacuated(ev, step, self._events)
        await self._counted_on(ev.node)
        if self._cluster.vmis.get(ev.key) != ev.uid or not self._cluster.pods.guest_running(ev.namespace, ev.uid):
            self._finish(ev)  # the view heard it go already, or its launcher end
        elif self._under_way.get(ev.key) == ev.uid:
            # Its guest stops in its own time: other nodes' evacuations need not wait for it.
            self._pacing.stopping(("vmi", *ev.key))
            self._due = True
            self._queue.poke()

    async def _counted_on(self, node: str) -> None:
        """One more VM moved off the node, on its GPUNode (`status.evacuated`), so the count outlives this leader."""

        async def decide(_: Body | None) -> Step | None:
            counted = nodestatus.evacuated_after(self._cluster, node)
            if counted is None:
                return None
            wanted = counted.wire()
            return lambda: self._writer.replace_status(kinds.GPU_NODE, wanted)

        try:
            await self._writer.update(None, decide)
        except Exception as e:  # a count missed is no evacuation missed: the Events and the metric have it
            reports.evacuation_uncounted(node, e)

    def _block(self, ev: Evacuation, reason: str) -> None:
        """Tell the tenant (an Event on each device of the set) and the platform (a log line, the metric) once per
        reason; the GPUNode says it for as long as it holds (the accountant's)."""
        if self._blocked.get(ev.key) == reason:
            return
        self._blocked[ev.key] = reason
        self._count("Blocked")
        reports.evacuation_blocked(ev, reason, self._events)

    def _release(self, key: VmiKey) -> None:
        del self._under_way[key]
        self._pacing.done(("vmi", *key))
        self._due = True
        self._gauge()

    def _finish(self, ev: Evacuation) -> None:
        if self._under_way.get(ev.key) == ev.uid:
            del self._under_way[ev.key]
            self._pacing.done(("vmi", *ev.key))
        self._due = True
        self._queue.poke()
        self._gauge()

    def _count(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.evacuations.labels("vm", result).inc()

    def _gauge(self) -> None:
        if self._metrics is not None:
            self._metrics.evacuations_in_flight.set(len(self._under_way))
            self._metrics.evacuations_blocked.set(len(self._blocked))
