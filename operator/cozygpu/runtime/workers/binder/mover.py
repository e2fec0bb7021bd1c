"""Idle moves (§5.7), carried out: the binder's executor for a plan of `decisions.idlemoves`.

Called by the binder alone, inside one decision (§5: serialised with every other), when a bind request
or a waiting device fits nowhere. The moves are counted in the view at once (assumed: on both nodes
until written, state.capacity) and written in the background while the binder goes on with other
decisions; the order is decided again once every move's write is done, so each moved device is Bound
on its new node before the order uses the room, and a move that fails (someone attached the device
first) undoes nothing: the order is decided again on the view as the API has it. Each moved device gets a `Moved` Event
that names no other tenant's objects (§14) (runtime.workers.binder.reports).

A device moves only once idle for `idle_after` seconds (decisions.idlemoves), so the mover also tells the
binder when classes are worth deciding again: at once where a node's free plus idle units rose (`heard`), and
when each device that turned idle has been idle the wait (`ripe`, `sooner`), read from the view's order of
idle devices, whether it turned idle by a detach, by being placed or moved, or was found so in a list.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Sequence

from cozygpu.api import GPUDevice, kinds
from cozygpu.decisions import transitions
from cozygpu.decisions.idlemoves import Move, RoomPlan, leaving, plan_room
from cozygpu.decisions.placement import NoPlacement, Placement
from cozygpu.runtime.events import Recorder
from cozygpu.runtime.metrics import Metrics
from cozygpu.runtime.workers.binder import reports
from cozygpu.runtime.workers.binder.dispatcher import Dispatcher
from cozygpu.runtime.workers.binder.pacing import Pacing
from cozygpu.runtime.workers.binder.queue import WaitingRoom
from cozygpu.runtime.writes import Writer
from cozygpu.state.cluster import Cluster, DeviceKey

PLANS = 2  # plans whose moves are written at once: at most PLANS × the limit status writes for idle moves


class Mover:
    def __init__(
        self,
        cluster: Cluster,
        writer: Writer,
        queue: WaitingRoom,
        dispatcher: Dispatcher,
        *,
        limit: int,
        clock: Callable[[], dt.datetime],
        events: Recorder | None = None,
        metrics: Metrics | None = None,
        idle_after: float = 0.0,
        pacing: Pacing | None = None,
    ) -> None:
        """`queue`: the binder's waiting room, told of room a move left on its old node and of the sets to decide
        again once their moves are written; `dispatcher`: runs the moves' writes (cancelled with the binder);
        `limit`: the most moves one decision makes (0: never move); `idle_after`: seconds a device is idle before
        it may move for someone else; `pacing`: how many devices may leave cordoned nodes at once, shared with the
        binder's VM evacuations (§6.8)."""
        self._cluster = cluster
        self._writer = writer
        self._queue = queue
        self._dispatcher = dispatcher
        self.limit = limit
        self._clock = clock
        self._events = events
        self._metrics = metrics
        self._idle_after = idle_after
        self._for: frozenset[DeviceKey] = frozenset()  # the sets whose moves are being written
        # Devices that turned idle up to this reading of the view's idle clock have ripened and been handed out;
        # None until the first pass, which decides every waiting device with whatever is movable then.
        self._ripened: float | None = None
        self._plans = 0  # plans whose moves are being written, at most PLANS
        self.moved = 0  # devices moved since start, for the bench and tests
        # §6.8: idle devices leaving cordoned nodes, paced: their writes under way, by device.
        self._pacing = pacing if pacing is not None else Pacing(2, 5)
        self._leaving: set[DeviceKey] = set()
        self._evacuation_due = True  # looked at on the first pass, then when something may let one more go
        self._stuck: set[str] = set()  # classes of devices that found no other node: room for them is worth a look

    def heard_nodes(self, nodes: frozenset[str], room: frozenset[str]) -> bool:
        """A change named these nodes and left room in these classes: whether idle devices may leave a cordoned node
        now (one was cordoned, or room appeared for a class one of them waits on). Nothing else wakes it (§14.3)."""
        cordoned = self._cluster.capacity.is_cordoned
        if any(cordoned(node) for node in nodes) or (room & self._stuck):
            self._evacuation_due = True
        return self._evacuation_due

    def evacuate(self) -> None:
        """§6.8: start moving idle held devices off cordoned nodes to nodes that take them, at most
        `evacuations_per_node` under way off a node and `evacuations` in all; each counted in the view at once
        (assumed), written in the background, with a `Moved` Event saying why. Called on each pass, it looks only
        when something happened that may let one more go."""
        if not self._evacuation_due:
            return
        self._evacuation_due = False
        if not self._cluster.capacity.any_cordoned():
            self._stuck = set()
            return
        moves = leaving(self._cluster, self._idle_after, self._pacing.room, self._pacing.left())
        self._stuck = self._stuck_classes(moves)
        now = self._clock()
        for move in moves:
            new = transitions.bound(move.device, move.to, now)
            assumption = self._writer.assume(new)  # counted on both nodes until written (state.capacity)
            self._queue.gained(assumption.room)
            self._leaving.add(move.device.key)
            self._pacing.start(("device", *move.device.key), move.origin)
            self._dispatcher.spawn(self._write_leaving(move, new, assumption.token))

    def _stuck_classes(self, moves: Sequence[Move]) -> set[str]:
        """Classes of idle devices still on cordoned nodes after `moves`: room for them is worth another look."""
        going = {m.device.key for m in moves} | set(self._leaving)
        return {
            d.spec.class_name
            for name in self._cluster.capacity.cordoned()
            for d in self._cluster.devices.on(name)
            if d.key not in going and d.status.node_name == name and d.idle
        }

    async def _write_leaving(self, move: Move, new: GPUDevice, token: int) -> None:
        try:
            outcome = await self._writer.replace_status(kinds.GPU_DEVICE, new.wire(), assumption=token)
            written, error = outcome.written, None
        except Exception as e:  # the API failed us: the view has the device as the API has it, tried again later
            written, error = False, e
        finally:
            self._leaving.discard(move.device.key)
            self._pacing.done(("device", *move.device.key))
            self._evacuation_due = True  # one fewer under way: the next may go
            self._queue.poke()
        if self._metrics is not None:
            self._metrics.evacuations.labels("device", "Moved" if written else "Failed").inc()
        if not written:
            reports.move_failed(move, error)
            return
        self.moved += 1
        reports.moved_off_cordoned(move, self._events)

    def _moving(self) -> bool:
        """Whether idle devices may move at all now: for someone else (§5.7), or off a cordoned node (§6.8)."""
        return self.limit > 0 or self._cluster.capacity.any_cordoned()

    def heard(self, reach: frozenset[str]) -> frozenset[str]:
        """Classes where a node's free plus idle units rose: those to decide again now, since the idle devices there
        may be movable already (those that are not yet are handed out by `ripe` when they are)."""
        return reach if self.limit > 0 else frozenset()

    def ripe(self) -> frozenset[str]:
        """Classes served where devices have been idle `idle_after` seconds since last asked: their oldest waiting
        are decided again (§5.5, §5.7), and devices on cordoned nodes may leave now (§6.8). O(log n) plus the devices
        that ripened."""
        if not self._moving():
            return frozenset()
        until = self._cluster.capacity.idle_clock() - self._idle_after
        after, self._ripened = self._ripened, until
        if after is None or until <= after:
            return frozenset()
        if self._cluster.capacity.any_cordoned():
            self._evacuation_due = True  # a device on a cordoned node (which serves no class) may have ripened
        return frozenset(self._cluster.capacity.turned_idle(after, until)) if self.limit > 0 else frozenset()

    def sooner(self, timeout: float | None) -> float | None:
        """The binder's wait, shortened to when the next device that turned idle may move."""
        if not self._moving() or self._ripened is None:
            return timeout
        since = self._cluster.capacity.next_idle(self._ripened)
        if since is None:
            return timeout
        until = max(since + self._idle_after - self._cluster.capacity.idle_clock(), 0.0)
        return until if timeout is None else min(timeout, until)

    def make_room(self, devices: Sequence[GPUDevice], outcome: Placement | NoPlacement, *, asked: bool) -> bool:
        """When `devices` fit on no node for want of free units (`outcome`), plan the moves after which they fit on
        one, count them in the view and write them in the background; True while moves for the set are under way
        (the binder decides the set again once they are written: `again`). The log names the set the room is
        for; Events do not (§14). With PLANS plans out already, a bind request (`asked`: decided again on every
        pass) waits for one to be done, and a waiting device waits Pending as if no plan existed, decided again
        when room or reach for it appears, so a backlog costs no work per plan done (§14.3)."""
        keys = frozenset(d.key for d in devices)
        if not keys.isdisjoint(self._for):
            return True  # moves made for it are still being written
        if self.limit <= 0 or not isinstance(outcome, NoPlacement) or not outcome.full:
            return False
        if self._plans >= PLANS:  # the API's calls are admissions' first (§14.3)
            return asked
        plan = plan_room(self._cluster, devices, self.limit, self._idle_after)
        if plan is None:
            return False
        now = self._clock()
        news = [transitions.bound(m.device, m.to, now) for m in plan.moves]
        tokens = []
        for new in news:
            assumption = self._writer.assume(new)  # counted on both nodes until written (state.capacity)
            tokens.append(assumption.token)
            self._queue.gained(assumption.room)
        self._for |= keys
        self._plans += 1
        self._dispatcher.spawn(self._write(plan, news, tokens, devices, keys))
        return True

    async def _write(
        self,
        plan: RoomPlan,
        news: list[GPUDevice],
        tokens: list[int],
        devices: Sequence[GPUDevice],
        keys: frozenset[DeviceKey],
    ) -> None:
        try:
            results = await asyncio.gather(
                *(
                    self._writer.replace_status(kinds.GPU_DEVICE, n.wire(), assumption=t)
                    for n, t in zip(news, tokens, strict=True)
                ),
                return_exceptions=True,
            )
            for move, result in zip(plan.moves, results, strict=True):
                written = not isinstance(result, BaseException) and result.written
                if self._metrics is not None:
                    self._metrics.idle_moves.labels("Moved" if written else "Failed").inc()
                if not written:
                    reports.move_failed(move, result if isinstance(result, BaseException) else None)
                    continue
                self.moved += 1
                reports.moved_idle(move, self._events, devices)
        finally:
            self._for -= keys
            self._plans -= 1
            self._queue.again(keys)  # on the view with the moves as the API has them: placed, or planned anew
