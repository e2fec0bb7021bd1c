"""GPUDevices by key, with the indexes decisions look them up by, and the waiting room in turn (§5.5).

Callers: `state.indexers` stores and forgets devices here (`put`, `pop`) and counts their units
elsewhere (`state.capacity`, `state.budgets`); everything else reads through `DeviceReads`
(`Cluster.devices`). Indexes are per node, namespace, bind request (all, and those still open),
attachment and class; devices not Bound are kept in turn, and those the binder places on its
own by class and count, so room for a class wakes only what fits (§14.3). Pending and Lost devices
are also kept by when they began to wait, per class and phase, so the metrics read the longest wait
without a scan (§10).
"""

from __future__ import annotations

import bisect
import datetime as dt
import heapq
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from cozygpu.api import ConditionStatus, GPUDevice, Phase
from cozygpu.api.names import CONDITION_PLACED
from cozygpu.state.counts import add as add_count
from cozygpu.state.store import ReadOnly, Store, writes
from cozygpu.state.tombstones import DEFAULT_LIMIT, Tombstones, version

DeviceKey = tuple[str, str]  # (namespace, name)
Turn = tuple[dt.datetime, int, str, str]  # §5.5: creation, first sight, namespace, name

_LAST = dt.datetime.max.replace(tzinfo=dt.UTC)
_WAITS = frozenset({Phase.PENDING, Phase.LOST})
Since = tuple[dt.datetime, str, str]  # when it began to wait, namespace, name


def _drop(index: dict[Any, set[DeviceKey]], value: Any, key: DeviceKey) -> None:
    if value in index:
        index[value].discard(key)
        if not index[value]:
            del index[value]


class Devices:
    def __init__(self, tombstones: int = DEFAULT_LIMIT) -> None:
        self.store: Store[DeviceKey, GPUDevice] = Store(tombstones)
        # Removed devices by uid: a name can be taken again at once, a uid never (the order ledger's question).
        self._gone_uids = Tombstones(tombstones)
        self._by_node: dict[str, set[DeviceKey]] = defaultdict(set)
        self._by_namespace: dict[str, set[DeviceKey]] = defaultdict(set)
        self._by_request: dict[str, set[DeviceKey]] = defaultdict(set)
        self._open_requests: dict[str, set[DeviceKey]] = defaultdict(set)
        # Devices that open requests name, by how many carriers name them: a set half written by its webhook (§4).
        self._named_open: dict[DeviceKey, int] = {}
        self._by_attachment: dict[DeviceKey, set[DeviceKey]] = defaultdict(set)  # (namespace, vmi) -> devices
        self._by_class: dict[str, set[DeviceKey]] = defaultdict(set)
        # Devices not Bound, first come first served (§5.5), kept in order rather than sorted per pass.
        self._turns: list[Turn] = []
        self._turn_of: dict[DeviceKey, Turn] = {}
        # Devices the binder places on its own (`GPUDevice.awaits_node`) by class and count, each in turn.
        self._waiting: dict[str, dict[int, list[Turn]]] = {}
        self._waiting_at: dict[DeviceKey, tuple[str, int, Turn]] = {}
        # Order of first sight: creation timestamps have one-second precision, so devices
        # created within a second are told apart by when the watch delivered them.
        self._arrival: dict[DeviceKey, int] = {}
        self._arrivals = 0
        # Pending and Lost devices by (class, phase), in the order they began to wait (`waiting_since`).
        self._since: dict[tuple[str, Phase], list[Since]] = {}
        self._since_of: dict[DeviceKey, tuple[tuple[str, Phase], Since]] = {}
        # Devices per (class, phase; None: not decided on yet), for the metrics: a scrape reads no device (§10).
        self._phases: dict[tuple[str, Phase | None], int] = {}
        # Decisions whose writes are in flight (§13.1): the version each was decided on, and its token.
        self._assumed: dict[DeviceKey, tuple[int, int]] = {}
        self._assumptions = 0

    # -- writes (the cluster's only) ---------------------------------------------

    @writes
    def put(self, key: DeviceKey, device: GPUDevice) -> GPUDevice | None:
        """Store the device and index it; returns the one it replaced (unindexed)."""
        old = self.store.put(key, device, device.metadata.resource_version)
        if old is not None:
            self._unindex(key, old)
        if key not in self._arrival:
            self._arrivals += 1
            self._arrival[key] = self._arrivals
        self._index(key, device)
        return old

    @writes
    def pop(self, key: DeviceKey, removal: str | None) -> GPUDevice | None:
        old = self.store.pop(key, removal)
        self._arrival.pop(key, None)
        self._assumed.pop(key, None)
        if old is not None:
            self._unindex(key, old)
            if old.metadata.uid:
                self._gone_uids.bury(old.metadata.uid, version(removal))
        return old

    @writes
    def assume(self, key: DeviceKey, decided_on: str | None) -> int:
        """A decision on the device, made on version `decided_on`, is in flight: its token for `settle`."""
        self._assumptions += 1
        self._assumed[key] = (version(decided_on), self._assumptions)
        return self._assumptions

    @writes
    def settle(self, key: DeviceKey, token: int) -> bool:
        """The write of assumption `token` is done or failed; False, and nothing changed, if the device carries
        another one."""
        if key not in self._assumed or self._assumed[key][1] != token:
            return False
        del self._assumed[key]
        return True

    def _index(self, key: DeviceKey, device: GPUDevice) -> None:
        add_count(self._phases, (device.spec.class_name, device.status.phase), 1)
        if device.status.node_name:
            self._by_node[device.status.node_name].add(key)
        self._by_namespace[key[0]].add(key)
        self._by_class[device.spec.class_name].add(key)
        if device.status.attached_to is not None:
            self._by_attachment[(key[0], device.status.attached_to.vmi)].add(key)
        request = device.status.bind_request
        if request is not None:
            self._by_request[request.id].add(key)
            if request.open:
                self._open_requests[request.id].add(key)
                for name in request.devices:
                    add_count(self._named_open, (key[0], name), 1)
        if not device.holds_gpus:
            turn = self.turn(device)
            bisect.insort(self._turns, turn)
            self._turn_of[key] = turn
            if device.awaits_node:
                class_name, count = device.spec.class_name, device.spec.count
                bisect.insort(self._waiting.setdefault(class_name, {}).setdefault(count, []), turn)
                self._waiting_at[key] = (class_name, count, turn)
        since = _began_waiting(device)
        if since is not None and device.status.phase is not None:  # a phase of _WAITS
            line, entry = (device.spec.class_name, device.status.phase), (since, key[0], key[1])
            bisect.insort(self._since.setdefault(line, []), entry)
            self._since_of[key] = (line, entry)

    def _unindex(self, key: DeviceKey, device: GPUDevice) -> None:
        add_count(self._phases, (device.spec.class_name, device.status.phase), -1)
        since = self._since_of.pop(key, None)
        if since is not None:
            line, entry = since
            entries = self._since[line]
            del entries[bisect.bisect_left(entries, entry)]
            if not entries:
                del self._since[line]
        turn = self._turn_of.pop(key, None)
        if turn is not None:
            del self._turns[bisect.bisect_left(self._turns, turn)]
        waiting = self._waiting_at.pop(key, None)
        if waiting is not None:
            class_name, count, turn = waiting
            of_class = self._waiting[class_name]
            in_line = of_class[count]
            del in_line[bisect.bisect_left(in_line, turn)]
            if not in_line:
                del of_class[count]
                if not of_class:
                    del self._waiting[class_name]
        request = device.status.bind_request
        if request is not None and request.open:
            for name in request.devices:
                add_count(self._named_open, (key[0], name), -1)
        attached = device.status.attached_to
        if attached is not None:
            _drop(self._by_attachment, (key[0], attached.vmi), key)
        for index, value in (
            (self._by_class, device.spec.class_name),
            (self._by_node, device.status.node_name),
            (self._by_namespace, key[0]),
            (self._by_request, request.id if request else None),
            (self._open_requests, device.open_request.id if device.open_request else None),
        ):
            if value is not None:
                _drop(index, value, key)

    # -- reads -------------------------------------------------------------------

    def assumed(self, namespace: str, name: str) -> bool:
        """Whether a decision on the device is in flight (counted before its write returns, §13.1)."""
        return (namespace, name) in self._assumed

    def decided_on(self, key: DeviceKey) -> int | None:
        """The version an in-flight decision on the device was made on: an event no newer cannot undo it."""
        assumed = self._assumed.get(key)
        return None if assumed is None else assumed[0]

    def removed(self, uid: str) -> bool:
        """Whether this view saw the device of that uid go (while remembered)."""
        return self._gone_uids.at(uid) is not None

    def arrival(self, namespace: str, name: str) -> int:
        return self._arrival.get((namespace, name), 0)

    def turn(self, device: GPUDevice) -> Turn:
        """§5.5 first come first served: by creation, then by when the view first saw it (creation times have
        one-second precision), then by name; a device without a creation time (never from the API) last."""
        namespace = device.namespace or ""
        created = device.metadata.creation_timestamp or _LAST
        return created, self._arrival.get((namespace, device.name), 0), namespace, device.name

    def names_node(self, node: str) -> bool:
        """Whether some device's status names the node."""
        return node in self._by_node

    def on(self, node: str) -> Iterator[GPUDevice]:
        """Devices whose status names the node (Bound there or Lost from there)."""
        items = self.store.items
        for key in self._by_node.get(node, ()):
            yield items[key]

    def in_namespace(self, namespace: str) -> Iterator[GPUDevice]:
        items = self.store.items
        for key in self._by_namespace.get(namespace, ()):
            yield items[key]

    def held_by_class(self, node: str) -> dict[str, int]:
        """Units held on the node by Bound devices, per class name (summed from the node's few devices;
        decisions read the counters per resource, `held_units`)."""
        out: dict[str, int] = {}
        for d in self.on(node):
            if d.holds_gpus and d.status.node_name == node:
                out[d.spec.class_name] = out.get(d.spec.class_name, 0) + d.spec.count
        return out

    def of_request(self, request_id: str) -> list[GPUDevice]:
        return [self.store.items[k] for k in self._by_request.get(request_id, ())]

    def attached_to(self, namespace: str, vmi: str) -> list[GPUDevice]:
        """Devices whose attachment names this VMI (any uid)."""
        return [self.store.items[k] for k in self._by_attachment.get((namespace, vmi), ())]

    def of_class(self, name: str) -> list[GPUDevice]:
        return [self.store.items[k] for k in self._by_class.get(name, ())]

    def keys_of_class(self, name: str) -> list[DeviceKey]:
        return list(self._by_class.get(name, ()))

    def count_of_class(self, name: str) -> int:
        """How many devices name the class, without listing them (a class's finalizer, its webhook)."""
        return len(self._by_class.get(name, ()))

    def named_by_open_request(self, namespace: str, name: str) -> bool:
        """Whether some open bind request names the device, whether or not it carries the request yet (§4)."""
        return (namespace, name) in self._named_open

    def waiting_since(self) -> dict[tuple[str, Phase], dt.datetime]:
        """Per (class, phase), Pending or Lost: when the device waiting longest began to wait (§10's metric)."""
        return {line: entries[0][0] for line, entries in self._since.items()}

    def open_request_ids(self) -> list[str]:
        """Ids of bind requests that some device carries without a result."""
        return list(self._open_requests)

    def by_phase(self) -> dict[tuple[str, Phase | None], int]:
        """How many devices per class and phase (None: not decided on yet), kept as devices change."""
        return dict(self._phases)

    def open_request_count(self) -> int:
        """How many bind requests some device carries without a result (no copy: read per admission)."""
        return len(self._open_requests)

    def unbound_in_turn(self) -> list[GPUDevice]:
        """Devices not Bound, first come first served (`turn`), from the order kept as they change."""
        return [self.store.items[(t[2], t[3])] for t in self._turns]

    def waiting(self, class_name: str, most: int | None = None) -> list[GPUDevice]:
        """The class's devices the binder places on its own (`GPUDevice.awaits_node`) that ask for at most
        `most` units (every one if None), first come first served: the few that room can wake (§14.3)."""
        of_class = self._waiting.get(class_name, {})
        lines = [line for count, line in of_class.items() if most is None or count <= most]
        return [self.store.items[(t[2], t[3])] for t in heapq.merge(*lines)]

    def heads_waiting(self, class_name: str) -> list[GPUDevice]:
        """The class's first device in turn of each count waiting (§5.5): one per size, oldest first."""
        lines = self._waiting.get(class_name, {}).values()
        return [self.store.items[(line[0][2], line[0][3])] for line in sorted(lines) if line]

    def next_waiting(self, class_name: str, most: int, after: Turn | None) -> GPUDevice | None:
        """The class's first device in turn after `after` that awaits a node and asks for at most `most`
        units: a cursor over the waiting room that devices placed or arriving meanwhile do not upset."""
        best: Turn | None = None
        for count, line in self._waiting.get(class_name, {}).items():
            if count > most:
                continue
            at = 0 if after is None else bisect.bisect_right(line, after)
            if at < len(line) and (best is None or line[at] < best):
                best = line[at]
        return None if best is None else self.store.items[(best[2], best[3])]


def _began_waiting(device: GPUDevice) -> dt.datetime | None:
    """When a Pending or Lost device, not on its way out, began to wait: its Placed condition turned False then
    (the binder writes it with the phase), or, without one, it was created. None for any other device."""
    if device.status.phase not in _WAITS or device.deleting:
        return None
    placed = next((c for c in device.status.conditions if c.type == CONDITION_PLACED), None)
    if placed is not None and placed.status is ConditionStatus.FALSE and placed.last_transition_time is not None:
        return placed.last_transition_time
    return device.metadata.creation_timestamp


class DeviceReads(ReadOnly[DeviceKey, GPUDevice]):
    """The devices part as workers and decisions read it (`Cluster.devices`): every device by key, the indexes
    and the waiting room, none of the writes."""

    def __init__(self, part: Devices) -> None:
        super().__init__(part.store.items)
        self.removed = part.removed
        self.arrival = part.arrival
        self.turn = part.turn
        self.on = part.on
        self.in_namespace = part.in_namespace
        self.held_by_class = part.held_by_class
        self.of_request = part.of_request
        self.attached_to = part.attached_to
        self.of_class = part.of_class
        self.count_of_class = part.count_of_class
        self.named_by_open_request = part.named_by_open_request
        self.assumed = part.assumed
        self.open_request_ids = part.open_request_ids
        self.open_request_count = part.open_request_count
        self.by_phase = part.by_phase
        # The waiting room (§5.5): what the binder hands out next, and what the metrics read (§10).
        self.unbound_in_turn = part.unbound_in_turn
        self.waiting = part.waiting
        self.heads_waiting = part.heads_waiting
        self.next_waiting = part.next_waiting
        self.waiting_since = part.waiting_since
