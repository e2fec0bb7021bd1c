"""The binder's waiting room (§5.5, §14.3): what the view's changes name, handed out as each pass's work.

The view's changes arrive here (`changed`), and so do the binder's own hints: room a decision or a move left on a
node (`note_room`, `gained`), sets to decide again once their moves are written (`again`), classes where idle
devices ripened (`ripened`). A pass takes its devices with `next_pass`, in turn, and what it left when it stepped
aside goes back with `keep`, to be decided first next time without sorting again. Only the Lease holder's binder
listens (§10): a standby's queue hears nothing, and its first pass takes everything the view holds.

Called by the binder's loop, its mover and its confirmations (runtime.workers.binder).
"""

from __future__ import annotations

import asyncio
import heapq

from cozygpu.api import GPUDevice, kinds
from cozygpu.decisions.waiting import in_turn, must_decide, oldest
from cozygpu.state.cluster import Change, Cluster, DeviceKey


class WaitingRoom:
    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster
        self.wake = asyncio.Event()
        self._listening = False
        # What the next pass decides (`waiting.to_decide`): devices with events since the last pass,
        # classes that gained room, classes whose serving nodes changed; everything on the first pass.
        self._fresh: set[DeviceKey] = set()
        self._room: set[str] = set()
        self._served: set[str] = set()
        self._reach: set[str] = set()  # classes where idle moves may make room now (§5.7): their oldest retry
        self._first = True
        # What a pass that stepped aside had left, in turn; the classes it found no room for so far.
        self._rest: list[GPUDevice] = []
        self._passed_over: set[str] = set()
        # A bind request arrived: its admission waits, so the waiting room steps aside (§14.3).
        self.asked = False

    def listen(self) -> None:
        """Hear the view's changes from now on (the binder's `run` does, on the Lease holder)."""
        self._listening = True

    @property
    def listening(self) -> bool:
        return self._listening

    def changed(self, change: Change, reach: frozenset[str]) -> None:
        """A change in the view: a device may be new in the waiting room or carry a request, a class may have
        gained room or serving nodes; only what it names is decided again, and a change that names none of
        these (a VMI's status, a node's heartbeat, a budget) does not wake the binder at all. `reach`: the
        classes of the change's where idle moves may make room now (the mover's say)."""
        if not self._listening:
            return
        self._reach |= reach
        if not (change.room or change.served or reach or (change.kind is kinds.GPU_DEVICE and not change.deleted)):
            return
        if change.kind is kinds.GPU_DEVICE and not change.deleted:
            key = (change.namespace, change.name)
            self._fresh.add(key)
            device = self._cluster.devices.get(key)
            if device is not None and device.open_request is not None:
                self.asked = True
        self._room |= change.room
        self._served |= change.served
        self.wake.set()

    def poke(self) -> None:
        self.wake.set()

    def again(self, keys: frozenset[DeviceKey]) -> None:
        """These devices are decided again on the next pass (a write failed, or their moves are written)."""
        self._fresh |= keys
        self.wake.set()

    def gained(self, room: frozenset[str]) -> None:
        """Room left on a node for these classes (a move, a bind taken back): a pass looks at it."""
        self._room |= room
        self.wake.set()

    def note_room(self, room: frozenset[str]) -> None:
        """Room a decision of the pass under way left (a gather moved devices off a node): the next pass."""
        self._room |= room

    def ripened(self, classes: frozenset[str]) -> None:
        """Classes where devices have been idle long enough to move: their oldest waiting are decided again."""
        self._reach |= classes

    def next_pass(self) -> tuple[list[GPUDevice], set[str]]:
        """The devices the pass must decide, in turn, and the classes it looks at for room; the queue is empty
        after."""
        if self._first:
            self._first = False
            musts, room = in_turn(self._cluster), set()  # the order the view keeps: no sort of every device
        else:
            musts = must_decide(self._cluster, self._served, self._fresh | oldest(self._cluster, self._reach))
            if self._rest:
                musts = list(heapq.merge(self._rest, musts, key=self._cluster.devices.turn))
            room = self._room - self._served
        self._fresh, self._room, self._served, self._reach, self._rest = set(), set(), set(), set(), []
        self._passed_over.clear()
        return musts, room

    def keep(self, musts: list[GPUDevice], at: int, for_room: bool, room: set[str]) -> None:
        """What a pass had left (from the device it stopped at), for the next pass, first."""
        self._rest = musts[max(at - 1, 0) :] if not for_room else musts[at:]
        self._room |= room
        self.wake.set()

    def passed_over(self, class_name: str) -> None:
        """The pass found no room for a device of the class."""
        self._passed_over.add(class_name)

    def overtaken(self, class_name: str) -> None:
        """Room appeared mid-pass that an older device of the class fits in: it goes first (§5.5)."""
        self._room.add(class_name)

    def stepping_aside(self) -> bool:
        """A request waits for its answer, or room appeared that a device passed over in this pass could use."""
        return self.asked or not self._room.isdisjoint(self._passed_over)
