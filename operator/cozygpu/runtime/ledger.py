"""Orders admitted by any replica and not yet counted everywhere, kept in the API: §7.4 across replicas (§10).

Every synced replica admits GPUDevice creates, and the leader's binder admits template orders
at bind time (§5.4); each process's own counting (reservations, the binder's assumptions) does
not see another's. So every order under a budget is also written into one ConfigMap in the
operator's namespace, under the resourceVersion its writer read: two writers on the same
version cannot both land, and the loser reads again and decides with the winner's order
counted. One object for every namespace, since a budget's selector can cover several. Called
by runtime.admission.validation (held creates) and runtime.workers.binder.confirmations (the binder's).

A process writes the ledger one write at a time: the orders of one moment, from every tenant and
from the binder, share one read and one write (group commit), so a tenant's burst of creates
costs one turn per moment, not one per create, and cannot make another tenant's order lose
every turn to it (§14). Only other replicas' writes contend. A moment decides on the ledger as
this process last wrote it, without reading it again, unless another replica wrote since: the
write then conflicts and the moment reads and decides again; after a conflict, moments read first
for a while, so replicas taking turns do not each pay a failed write.

An entry is counted by a replica until its own view counts the device (§7.2): the device of the
entry's uid, since a name is free again the moment its device goes. The first writer whose view
counts it marks when; it leaves the ledger at a write SETTLE seconds after that (so a replica
whose watch is a moment behind still finds it), when a view saw that device go, or when it expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from cozygpu.api import kinds
from cozygpu.decisions.budgets import Order
from cozygpu.kube.adapter import AlreadyExists, AsyncKube, Conflict, NotFound
from cozygpu.state.cluster import Cluster

CONFIG_MAP = kinds.kind("ConfigMap")
NAME = "cozy-gpu-orders"
# Each attempt reads and writes once; every replica's orders take turns here.
ATTEMPTS = 20
# Seconds an entry stays after its writer's view counts it: every replica's watch has it by then.
SETTLE = 5.0
# Seconds after a conflict during which a moment reads the ledger before it writes: another replica is writing.
CONTENDED = 2.0

# The ledger is one ConfigMap, whose data the API server caps at 1 MiB: a write past that fails, and with it every
# order of every tenant (fail closed). Held orders may fill it to HELD_BYTES; past that, only a namespace under its
# share of HELD_BYTES (§14), and never past HELD_MAX: the rest is left to the binder's template orders.
HELD_BYTES, HELD_MAX = 512 * 1024, 768 * 1024

# A moment's decisions yield to the event loop after this many, or this long (§14.3: a pass yields every 2 ms).
YIELD_EVERY, YIELD_AFTER = 32, 0.002

T = TypeVar("T")
Claim = tuple[str, str, str]  # the device an order is for: namespace, name, uid


@dataclass(frozen=True)
class Entry:
    namespace: str
    name: str
    class_name: str
    count: int
    expires: float  # wall-clock seconds: every replica reads the same entries
    uid: str = ""  # the device's: another device of the same name is another order
    counted: float | None = None  # when a writer's view first counted the device


class _Room:
    """How much of the ledger each namespace's entries take, while one moment decides: a held order of a namespace
    past its share is refused once the entries come to `limit` bytes, so one tenant cannot fill the ledger."""

    def __init__(self, entries: Mapping[str, Entry], limit: int, ttl: float) -> None:
        self._limit, self._most, self._ttl = limit, limit * HELD_MAX // HELD_BYTES, ttl
        self._by_namespace: dict[str, int] = {}
        self._total = 0
        for key, entry in entries.items():
            self.take(entry.namespace, _size(key, entry))

    def refusal(self, namespace: str, name: str, size: int) -> str | None:
        mine, total = self._by_namespace.get(namespace, 0), self._total + size
        if total <= self._limit:
            return None
        if total <= self._most and mine + size <= self._limit // len(self._by_namespace.keys() | {namespace}):
            return None  # under its share: another namespace's flood does not refuse it
        return (
            f"GPUDevice {name}: namespace {namespace} has {mine // 1024 + 1} KiB of orders in the operator's order"
            " ledger, more than its share while the ledger is full; they leave it as their devices are made, or"
            f" within {self._ttl:g} s: retry then"
        )

    def take(self, namespace: str, size: int) -> None:
        self._by_namespace[namespace] = self._by_namespace.get(namespace, 0) + size
        self._total += size


class Busy(Exception):
    """Every attempt lost to another replica's write: the order is not admitted (fail closed), and is retried."""


Decide = Callable[[list[Order]], tuple[T, Mapping[Claim, Order]]]


@dataclass(eq=False)
class _Turn:
    decide: Decide[Any]
    done: asyncio.Future[Any]


class Ledger:
    def __init__(
        self,
        kube: AsyncKube,
        namespace: str,
        ttl: float,
        cluster: Cluster,
        *,
        mine: Callable[[str, str, str], bool] = lambda namespace, name, uid: False,
        budgets_required: bool = False,
        clock: Callable[[], float] = time.time,
        held_bytes: int = HELD_BYTES,
    ) -> None:
        """`mine`: orders this process counts already though its view does not (its reservations); what its
        binder decided and has not written yet (assumed in the view) it counts too."""
        self._kube, self._namespace, self._ttl, self._clock = kube, namespace, ttl, clock
        self._cluster, self._mine, self._budgets_required = cluster, mine, budgets_required
        self._queue: list[_Turn] = []
        self._task: asyncio.Task[None] | None = None
        # The ledger as this process last wrote it, and when a write of it last conflicted (time.monotonic()).
        self._written: dict[str, Any] | None = None
        self._conflicted = -CONTENDED
        self._held_bytes = held_bytes
        self._room = _Room({}, held_bytes, ttl)  # the moment being decided's

    def needed(self, namespace: str) -> bool:
        """Whether an order there can exceed anything: a budget covers the namespace (or one is required, §7)."""
        return self._budgets_required or bool(self._cluster.budgets_covering(namespace))

    async def admit(self, order: Order, name: str, uid: str, check: Callable[[list[Order]], str | None]) -> str | None:
        """One held create: `check` the order with the others' orders; if it passes, record it. The refusal, if any."""

        def decide(others: list[Order]) -> tuple[str | None, dict[Claim, Order]]:
            entry = Entry(order.namespace, name, order.class_name, order.count, self._clock() + self._ttl, uid)
            size = _size(_key(order.namespace, name), entry)
            problem = check(others) or self._room.refusal(order.namespace, name, size)
            if problem is not None:
                return problem, {}
            self._room.take(order.namespace, size)
            return None, {(order.namespace, name, uid): order}

        return await self.record(decide)

    async def record(self, decide: Decide[T]) -> T:
        """`decide` on the orders other writers recorded that this process counts nowhere yet; its orders are
        recorded under the version read, in one write with the other decisions of the moment (nothing written when
        there are none). `decide` may run again, on a newer read, if another replica wrote first. Raises Busy when
        every attempt lost."""
        turn = _Turn(decide, asyncio.get_running_loop().create_future())
        self._queue.append(turn)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        result: T = await turn.done  # a caller that gives up before its moment's read is left out of it
        return result

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            try:
                await self._commit(batch)
            except asyncio.CancelledError:
                for turn in [*batch, *self._queue]:
                    turn.done.cancel()
                self._queue = []
                raise
            except Exception as e:  # Busy, or the API's failure: each caller fails closed with it
                for turn in batch:
                    if not turn.done.done():
                        turn.done.set_exception(e)

    async def _commit(self, batch: list[_Turn]) -> None:
        """Decide every turn on one read and write their orders at once; each turn's outcome is set once written."""
        for _ in range(ATTEMPTS):
            body = self._written if time.monotonic() - self._conflicted >= CONTENDED else None
            self._written = None  # trusted once: a conflict, or any failure, and the next attempt reads
            if body is None:
                body = await self._kube.get_or_none(CONFIG_MAP, NAME, self._namespace)
            now = self._clock()
            live, others = {}, []
            for key, entry in _entries(body).items():
                ns, name = entry.namespace, entry.name
                counted = self._counted(entry)
                if entry.expires <= now or (counted and entry.counted is not None and now - entry.counted >= SETTLE):
                    continue
                if entry.uid and self._cluster.device_removed(entry.uid):
                    continue  # this view saw the device go: the order uses nothing now
                live[key] = dataclasses.replace(entry, counted=now) if counted and entry.counted is None else entry
                if not counted and not self._cluster.assumed(ns, name) and not self._mine(ns, name, entry.uid):
                    others.append(Order(ns, entry.class_name, entry.count, f"GPUDevice {name}"))
            self._room = _Room(live, self._held_bytes, self._ttl)
            # The decisions of one process need not see each other here: its reservations and view count them.
            outcomes: list[tuple[_Turn, Any, BaseException | None]] = []
            new: dict[Claim, Order] = {}
            turns, last = [t for t in batch if not t.done.done()], time.monotonic()  # who gave up is left out
            for i, turn in enumerate(turns):
                if i % YIELD_EVERY == YIELD_EVERY - 1 or time.monotonic() - last > YIELD_AFTER:
                    # A burst's moment decides many orders: the loop serves others meanwhile (§14.3).
                    await asyncio.sleep(0)
                    last = time.monotonic()
                if turn.done.done():
                    continue
                try:
                    result, orders = turn.decide(others)
                except Exception as e:  # one caller's failure is its own, not the moment's
                    outcomes.append((turn, None, e))
                    continue
                outcomes.append((turn, result, None))
                new.update(orders)
            for (ns, name, uid), order in new.items():
                key = _key(ns, name)
                if key in live and live[key].uid != uid:
                    key = _key(ns, f"{name}.{uid}")  # a create of the name racing another's: both orders count
                live[key] = Entry(ns, name, order.class_name, order.count, now + self._ttl, uid)
            try:
                self._written = await self._write(body, live) if new else body
            except (Conflict, AlreadyExists, NotFound):  # NotFound: deleted since this process last wrote it
                self._conflicted = time.monotonic()
                continue  # another replica landed first: read its orders and decide again
            for turn, result, error in outcomes:
                if turn.done.done():
                    continue
                if error is not None:
                    turn.done.set_exception(error)
                else:
                    turn.done.set_result(result)
            return
        raise Busy("the order ledger is busy; try again")

    def _counted(self, entry: Entry) -> bool:
        """The view counts the entry's device against budgets (§7.2) on the API's word, not on a decision in flight;
        a device of the same name and another uid is not it (deleted and made again, perhaps with more units)."""
        device = self._cluster.device(entry.namespace, entry.name)
        if device is None or (entry.uid and device.metadata.uid != entry.uid):
            return False
        return device.in_use and not self._cluster.assumed(entry.namespace, entry.name)

    async def _write(self, body: dict[str, Any] | None, entries: dict[str, Entry]) -> dict[str, Any]:
        """The ledger written under the version of `body` (created when there is none): the API's answer."""
        data = {k: _value(e) for k, e in entries.items()}
        meta: dict[str, Any] = {"name": NAME, "namespace": self._namespace}
        if body is None:
            return await self._kube.create(
                CONFIG_MAP, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}
            )
        meta["resourceVersion"] = body["metadata"]["resourceVersion"]
        return await self._kube.replace(
            CONFIG_MAP, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}
        )


def _key(namespace: str, name: str) -> str:
    """A ConfigMap key ([-._a-zA-Z0-9], at most 253): the readable `namespace.name` while it fits, a digest past that
    (a name may be 253 long; one over-long key would fail every write, other tenants' orders with it)."""
    key = f"{namespace}.{name}"
    return key if len(key) <= 253 else "sha256." + hashlib.sha256(key.encode()).hexdigest()


def _value(e: Entry) -> str:
    return json.dumps(
        {
            "namespace": e.namespace,
            "name": e.name,
            "class": e.class_name,
            "count": e.count,
            "expires": e.expires,
            "uid": e.uid,
            "counted": e.counted,
        }
    )


# Bytes an entry's value takes beyond its strings, at most: the JSON around them, its count and two times (about 135).
ENTRY_OVERHEAD = 160


def _size(key: str, e: Entry) -> int:
    """The bytes the entry takes in the ConfigMap's data at most, without writing it out (once per entry a moment)."""
    return len(key) + len(e.namespace) + len(e.name) + len(e.class_name) + len(e.uid) + ENTRY_OVERHEAD


def _entries(body: dict[str, Any] | None) -> dict[str, Entry]:
    out = {}
    for key, raw in ((body or {}).get("data") or {}).items():
        try:
            v = json.loads(raw)
            counted = None if v.get("counted") is None else float(v["counted"])
            out[key] = Entry(
                str(v["namespace"]),
                str(v["name"]),
                str(v["class"]),
                int(v["count"]),
                float(v["expires"]),
                str(v.get("uid") or ""),
                counted,
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # not ours to read: skipped, and dropped at the next write
    return out
