"""Idle moves (§5.7), carried out: the binder's executor for a plan of `decisions.idlemoves`.

Called by the binder alone, inside one decision (§5: serialised with every other), when a bind request
or a waiting device fits nowhere. The moves are counted in the view at once (assumed: on both nodes
until written, state.capacity) and written in the background while the binder goes on with other
decisions; the order is decided again once every move's write is done, so each moved device is Bound
on its new node before the order uses the room, and a move that fails (someone attached the device
first) undoes nothing: the order is decided again on the view as the API has it. Each moved device gets a `Moved` Event
that names no other tenant's objects (§14) (runtime.workers.reports).

A device moves only once idle for `idle_after` seconds (decisions.idlemoves), so the mover also tells the
binder when classes whose devices turned idle are worth deciding again (`heard`, `ripe`, `sooner`).
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import math
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from cozygpu.api import GPUDevice, kinds
from cozygpu.decisions import transitions
from cozygpu.decisions.idlemoves import RoomPlan, plan_room
from cozygpu.decisions.placement import NoPlacement, Placement
from cozygpu.runtime.events import Recorder
from cozygpu.runtime.metrics import Metrics
from cozygpu.runtime.workers import reports
from cozygpu.runtime.writes import Writer
from cozygpu.state.cluster import Cluster, DeviceKey

PLANS = 2  # plans whose moves are written at once: at most PLANS × the limit status writes for idle moves


class Mover:
    def __init__(
        self,
        cluster: Cluster,
        writer: Writer,
        *,
        limit: int,
        clock: Callable[[], dt.datetime],
        events: Recorder | None = None,
        metrics: Metrics | None = None,
        gained: Callable[[frozenset[str]], None] = lambda room: None,
        idle_after: float = 0.0,
        spawn: Callable[[Coroutine[Any, Any, None]], None] = lambda work: None,
        again: Callable[[frozenset[DeviceKey]], None] = lambda keys: None,
    ) -> None:
        """`limit`: the most moves one decision makes (0: never move); `gained`: room a move left on its
        old node for other classes, handed to the binder's waiting room; `idle_after`: seconds a device is
        idle before it may move for someone else; `spawn`: the binder's, for the moves' writes (cancelled with it);
        `again`: the set whose moves are written, or failed, to decide again."""
        self._cluster = cluster
        self._writer = writer
        self.limit = limit
        self._clock = clock
        self._events = events
        self._metrics = metrics
        self._gained = gained
        self._idle_after = idle_after
        self._spawn = spawn
        self._again = again
        self._for: frozenset[DeviceKey] = frozenset()  # the sets whose moves are being written
        # Classes whose devices turned idle, and when those devices may first move (monotonic), in time order.
        self._ripening: collections.deque[tuple[float, frozenset[str]]] = collections.deque()
        self._plans = 0  # plans whose moves are being written, at most PLANS
        self.moved = 0  # devices moved since start, for the bench and tests

    def heard(self, reach: frozenset[str]) -> frozenset[str]:
        """Classes where a device turned idle: those to decide again now (none, while moves must wait for the
        device to have been idle a while: then `ripe` hands them out when it has)."""
        if self.limit <= 0 or not reach:
            return frozenset()
        if not self._idle_after:
            return reach
        due = math.ceil(time.monotonic() + self._idle_after)  # one wake a second at most, never later than due
        if self._ripening and self._ripening[-1][0] == due:
            reach = self._ripening.pop()[1] | reach
        self._ripening.append((due, reach))
        return frozenset()

    def ripe(self) -> frozenset[str]:
        """Classes whose idle devices may move now, since last asked."""
        out: frozenset[str] = frozenset()
        while self._ripening and self._ripening[0][0] <= time.monotonic():
            out |= self._ripening.popleft()[1]
        return out

    def sooner(self, timeout: float | None) -> float | None:
        """The binder's wait, shortened to when the next idle devices may move."""
        if not self._ripening:
            return timeout
        until = max(self._ripening[0][0] - time.monotonic(), 0.0)
        return until if timeout is None else min(timeout, until)

    def make_room(self, devices: Sequence[GPUDevice], outcome: Placement | NoPlacement, *, asked: bool) -> bool:
        """When `devices` fit on no node for want of free units (`outcome`), plan the moves after which they fit on
        one, count them in the view and write them in the background; True while moves for the set are under way
        (the binder decides the set again once they are written: `again`). The log names the set the room is
        for; Events do not (§14). With PLANS plans out already, a bind request (`asked`: decided again on every
        pass) waits for one to be done, and a waiting device waits Pending as if no plan existed, decided again
        when room or reach for it appears, so a backlog costs no work per plan done (§14.3)."""
        keys = frozenset((d.namespace or "", d.name) for d in devices)
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
            self._gained(assumption.room)
        self._for |= keys
        self._plans += 1
        self._spawn(self._write(plan, news, tokens, devices, keys))
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
            self._again(keys)  # on the view with the moves as the API has them: placed, or planned anew
