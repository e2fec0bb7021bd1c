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
import enum
from collections.abc import Callable, Sequence

from cozygpu.api import GPUDevice, kinds
from cozygpu.decisions import transitions
from cozygpu.decisions.idlemoves import plan_room
from cozygpu.decisions.placement import NoPlacement, Placement
from cozygpu.runtime.events import Recorder
from cozygpu.runtime.workers import reports
from cozygpu.runtime.writes import Writer
from cozygpu.state.cluster import Cluster


class Room(enum.Enum):
    NO_PLAN = "no plan"  # no moves within the limit make room: the order is decided as it stands
    MADE = "made"  # every move is written: decide the order again, on the view with them
    FAILED = "failed"  # a move did not land: the order stays undecided, and is decided again on the next pass


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

    async def make_room(self, devices: Sequence[GPUDevice], outcome: Placement | NoPlacement) -> Room:
        """When `devices` fit on no node for want of free units (`outcome`), plan and write the moves after which
        they fit on one. The log names the set the room is for; Events do not (§14)."""
        if self.limit <= 0 or not isinstance(outcome, NoPlacement) or not outcome.full:
            return Room.NO_PLAN
        plan = plan_room(self._cluster, devices, self.limit)
        if plan is None:
            return Room.NO_PLAN
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
        return Room.MADE if done else Room.FAILED
