"""Idle moves (§5.7), carried out: the binder's executor for a plan of `decisions.idlemoves`.

Called by the binder alone, inside one decision (§5: serialised with every other), when a bind request
or a waiting device fits nowhere. The moves are counted in the view at once (assumed) and written
concurrently; the binder decides the order only after every move is written, so each moved device is
Bound on its new node before the order uses the room, and a move that fails (someone attached the
device first) leaves the order undecided and undoes nothing. Each moved device gets a `Moved` Event
that names no other tenant's objects (§14) (runtime.workers.reports).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Sequence

from cozygpu.api import GPUDevice, kinds
from cozygpu.decisions import transitions
from cozygpu.decisions.idlemoves import plan_room
from cozygpu.runtime.events import Recorder
from cozygpu.runtime.workers import reports
from cozygpu.runtime.writes import Writer
from cozygpu.state.cluster import Cluster


class Mover:
    def __init__(
        self,
        cluster: Cluster,
        writer: Writer,
        *,
        limit: int,
        clock: Callable[[], dt.datetime],
        events: Recorder | None = None,
        gained: Callable[[frozenset[str]], None] = lambda room: None,
    ) -> None:
        """`limit`: the most moves one decision makes (0: never move); `gained`: room a move left on its
        old node for other classes, handed to the binder's waiting room."""
        self._cluster = cluster
        self._writer = writer
        self.limit = limit
        self._clock = clock
        self._events = events
        self._gained = gained
        self.moved = 0  # devices moved since start, for the bench and tests

    async def make_room(self, devices: Sequence[GPUDevice]) -> bool:
        """Plan and write the moves after which `devices` fit on one node; True when there were some and every
        one is written. The log names the set the room is for; Events do not (§14)."""
        if self.limit <= 0:
            return False
        plan = plan_room(self._cluster, devices, self.limit)
        if plan is None:
            return False
        now = self._clock()
        news = [transitions.bound(m.device, m.to, now) for m in plan.moves]
        tokens = []
        for new in news:
            assumption = self._writer.assume(new)
            tokens.append(assumption.token)
            self._gained(assumption.room)
        results = await asyncio.gather(
            *(
                self._writer.replace_status(kinds.GPU_DEVICE, n.wire(), assumption=t)
                for n, t in zip(news, tokens, strict=True)
            ),
            return_exceptions=True,
        )
        done = True
        for move, result in zip(plan.moves, results, strict=True):
            if isinstance(result, BaseException) or not result.written:
                done = False
                reports.move_failed(move, result if isinstance(result, BaseException) else None)
                continue
            self.moved += 1
            reports.moved_idle(move, self._events, devices, plan.node)
        return done
