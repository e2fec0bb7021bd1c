"""Benchmark (issue 22 item 4, §5.7): a simulated day on a cloud of 8-GPU nodes, with idle moves and without.

Prints figures; asserts nothing (these machines are shared and noisy). In memory and seeded: the real
binder (runtime.workers.binder, its mover and its one writer) decides against the in-memory API of the
unit tests (tests/support/memkube.py), and the view hears of every write as the writer puts it in, as in
tests/unit/runtime/workers/binder/test_binder.py. What tenants do is drawn from the seed alone, before either run,
so both runs play the very same events; only the binder's `idle_moves` differs (0, then the default setting).
One day at each `--held` level: 85% (the binder's best fit, §5.3, keeps whole nodes free there: the
bench shows it) and 95%, where fragmentation leaves 8-GPU orders without a whole node.

The model: `--nodes` nodes of 8 units of one resource, one GPUClass (idleMoves: Allowed, the default).
A VM holds one held GPUDevice (§1.2, like a PVC) of 1 to 8 units, weighted toward small, 8 units for a
`--big` share of orders. A warm-up fills the cloud to the `--held` level (not in the figures), then
the day's events, half of them churn and half stops and starts:
- an order: the tenant creates a held device (the waiting room places it, §5.5) and, once it is Bound,
  starts its VM: the webhook's status write (attachedTo and a bind request, §4), which the binder
  answers; orders outnumber deletions while the units asked for are below `--held`, and the other way;
- a deletion: a random VM and its device go (running, stopped or still waiting);
- a stop: a running VM goes, its device stays Bound and turns idle (no attachment): movable (§5.7);
- a start: a stopped VM starts on its device where it is Bound. Stops and starts keep about `--stopped`
  of the VMs stopped.
After each event the binder runs its passes (as `Binder.run` does, without its 0.5 s retry timer) until
it has nothing left to do and every write has landed: then the next event. An order is "placed at once"
when its device is Bound then; one Bound after some later event was "placed late" (and its VM starts
then, if the tenant still wants it running); the rest were deleted while waiting or still wait.

Prints, per order size and for all: orders, the share placed at once without and with idle moves, and
the ratio; moves made per placed order; the wall time the binder took to settle after an order arrived
(its passes and its writes to the in-memory API), side by side; and checks printed, not asserted: nodes
seen holding more than their units, attached devices that moved, VM starts the binder refused.
Run: `make bench` (or `python bench/day.py --nodes 50 --events 1000`).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import itertools
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' in-memory API (tests/support)

from tests.support.memkube import MemKube

from cozygpu import logs
from cozygpu.api import GPUDevice, kinds
from cozygpu.api.names import API_VERSION
from cozygpu.runtime.view import View
from cozygpu.runtime.workers.binder import Binder
from cozygpu.runtime.writes import Writer
from cozygpu.settings import Settings
from cozygpu.state.cluster import Cluster

RESOURCE = "nvidia.com/GPU"
UNITS = 8  # per node
SMALL = {1: 36, 2: 22, 3: 6, 4: 16, 5: 3, 6: 4, 7: 3}  # weights of the sizes below 8
TENANTS = 50
EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SAMPLE_EVERY = 50  # events between looks at every node's units, for the checks and the use figure


@dataclass(frozen=True)
class Event:
    kind: str  # order, delete, stop, start
    vm: int
    size: int = 0
    warm: bool = False  # the warm-up that fills the cloud: not in the figures


def script(seed: int, nodes: int, events: int, *, held: float, stopped: float, big: float) -> list[Event]:
    """What tenants do, from the seed alone: the warm-up, then `events` events of the day."""
    rng = random.Random(seed)
    target = held * nodes * UNITS
    sizes: dict[int, int] = {}  # the VMs that exist, by the units their device asks for
    on: set[int] = set()  # those the tenant wants running
    ids = itertools.count()
    out: list[Event] = []

    def order(warm: bool) -> int:
        vm = next(ids)
        size = UNITS if rng.random() < big else rng.choices(list(SMALL), list(SMALL.values()))[0]
        sizes[vm] = size
        on.add(vm)
        out.append(Event("order", vm, size, warm))
        return vm

    while sum(sizes.values()) < target:
        vm = order(warm=True)
        if rng.random() < stopped:
            on.discard(vm)
            out.append(Event("stop", vm, warm=True))
    for _ in range(events):
        if rng.random() < 0.5:
            asked = sum(sizes.values())
            more = min(0.95, max(0.05, 0.5 + (target - asked) / (0.1 * target)))
            if rng.random() < more or not sizes:
                order(warm=False)
            else:
                vm = rng.choice(sorted(sizes))
                del sizes[vm]
                on.discard(vm)
                out.append(Event("delete", vm))
        elif on and len(sizes) - len(on) < stopped * len(sizes):
            vm = rng.choice(sorted(on))
            on.discard(vm)
            out.append(Event("stop", vm))
        elif len(on) < len(sizes):
            vm = rng.choice(sorted(set(sizes) - on))
            on.add(vm)
            out.append(Event("start", vm))
    return out


@dataclass
class Figures:
    orders: Counter[int] = field(default_factory=Counter)  # by size, the day's
    at_once: Counter[int] = field(default_factory=Counter)
    late: Counter[int] = field(default_factory=Counter)
    moves: int = 0
    settle: list[float] = field(default_factory=list)  # seconds to settle after each of the day's orders
    wall: float = 0.0
    held: list[float] = field(default_factory=list)  # the share of units Bound, sampled
    over: int = 0  # nodes seen holding more than their units
    moved_attached: int = 0  # attached devices found on another node than where their VM started
    refused_starts: int = 0  # VM starts the binder did not answer Succeeded


def _name(vm: int) -> tuple[str, str]:
    return f"t{vm % TENANTS}", f"vm{vm}"


class Day:
    """One run of the script against a fresh in-memory API, view and binder."""

    def __init__(self, nodes: int, idle_moves: int) -> None:
        settings = Settings()
        self.kube = MemKube()
        self.view = View(Cluster())
        writer = Writer(self.view, self.kube)
        self.nodes = nodes
        for n in range(nodes):
            self.view.apply(
                kinds.NODE,
                {
                    "metadata": {"name": f"node-{n:04d}", "resourceVersion": "1", "labels": {}},
                    "spec": {},
                    "status": {
                        "allocatable": {RESOURCE: str(UNITS)},
                        "conditions": [{"type": "Ready", "status": "True"}],
                    },
                },
            )
        self.view.apply(
            kinds.GPU_CLASS,
            {
                "apiVersion": API_VERSION,
                "kind": "GPUClass",
                "metadata": {"name": "gpu", "resourceVersion": "1"},
                "spec": {"mode": "passthrough", "resourceName": RESOURCE},
            },
        )
        self.now = EPOCH
        self.binder = Binder(
            self.view.cluster,
            writer,
            incomplete_after=settings.bind_timeout,
            concurrency=settings.api_concurrency,
            clock=lambda: self.now,
            idle_moves=idle_moves,
        )
        self.view.subscribe(self.binder.changed)
        self.state: dict[int, str] = {}  # waiting, running or stopped
        self.sizes: dict[int, int] = {}
        self.wants_on: set[int] = set()  # waiting VMs the tenant starts once placed
        self.counted: set[int] = set()  # the day's orders (not the warm-up's)
        self.started_on: dict[int, str] = {}  # running VMs: the node they started on
        self.requests = itertools.count()
        self.f = Figures()

    async def run(self, events: list[Event]) -> Figures:
        start, moved = time.perf_counter(), 0
        for i, e in enumerate(events):
            if not e.warm and (i == 0 or events[i - 1].warm):
                start, moved = time.perf_counter(), self.binder.mover.moved
            self.now += dt.timedelta(seconds=10)
            await self.play(e)
            await self.placed_late()
            if i % SAMPLE_EVERY == 0 and not e.warm:
                await self.sample()
        self.f.wall = time.perf_counter() - start
        self.f.moves = self.binder.mover.moved - moved
        return self.f

    async def play(self, e: Event) -> None:
        state = self.state.get(e.vm)
        if e.kind == "order":
            await self.order(e)
        elif e.kind == "delete" and state is not None:
            self.check_where(e.vm)
            gone = self.kube.remove(kinds.GPU_DEVICE, _name(e.vm)[1], _name(e.vm)[0])
            self.view.apply(kinds.GPU_DEVICE, gone, deleted=True)
            del self.state[e.vm]
            self.wants_on.discard(e.vm)
            await self.settle()
        elif e.kind == "stop" and state == "waiting":
            self.wants_on.discard(e.vm)
        elif e.kind == "stop" and state == "running":
            self.check_where(e.vm)
            await self.write_status(e.vm, attachedTo=None, bindRequest=None)  # the VMI gone, as §6 clears it
            self.state[e.vm] = "stopped"
        elif e.kind == "start" and state == "waiting":
            self.wants_on.add(e.vm)
        elif e.kind == "start" and state == "stopped":
            await self.start(e.vm)

    async def order(self, e: Event) -> None:
        namespace, name = _name(e.vm)
        body = {
            "apiVersion": API_VERSION,
            "kind": "GPUDevice",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"className": "gpu", "count": e.size},
        }
        self.view.apply(kinds.GPU_DEVICE, self.kube.put(kinds.GPU_DEVICE, body))
        self.sizes[e.vm] = e.size
        began = time.perf_counter()
        await self.settle()
        took = time.perf_counter() - began
        if not e.warm:
            self.counted.add(e.vm)
            self.f.orders[e.size] += 1
            self.f.settle.append(took)
        if self.bound(e.vm):
            self.f.at_once[e.size] += 0 if e.warm else 1
            await self.start(e.vm)
        else:
            self.state[e.vm] = "waiting"
            self.wants_on.add(e.vm)

    async def placed_late(self) -> None:
        """Waiting orders that some event's passes placed: their VMs start now, if still wanted."""
        for vm in sorted(v for v, s in self.state.items() if s == "waiting" and self.bound(v)):
            if vm in self.counted:
                self.f.late[self.sizes[vm]] += 1
            self.state[vm] = "stopped"
            if vm in self.wants_on:
                self.wants_on.discard(vm)
                await self.start(vm)

    async def start(self, vm: int) -> None:
        """The webhook's one status write (§4): the device attached and a bind request; the binder answers it."""
        since = self.now.isoformat()
        name = _name(vm)[1]
        request = {"id": f"r{next(self.requests)}", "vmi": name, "devices": [name], "requestedAt": since}
        await self.write_status(vm, attachedTo={"vmi": name, "uid": f"vmi-{vm}", "since": since}, bindRequest=request)
        status = self.stored(vm)["status"]
        if (status.get("bindRequest") or {}).get("result") != "Succeeded":
            self.f.refused_starts += 1
            await self.write_status(vm, attachedTo=None, bindRequest=None)
            self.state[vm] = "stopped"
            return
        self.state[vm] = "running"
        self.started_on[vm] = status["nodeName"]

    def check_where(self, vm: int) -> None:
        """A running VM's device is where the VM started (§5.7 never moves an attached device)."""
        if self.state.get(vm) == "running" and self.stored(vm)["status"].get("nodeName") != self.started_on[vm]:
            self.f.moved_attached += 1

    async def write_status(self, vm: int, **status: Any) -> None:
        stored = self.stored(vm)
        new = {k: v for k, v in {**stored.get("status", {}), **status}.items() if v is not None}
        self.view.apply(kinds.GPU_DEVICE, self.kube.change(kinds.GPU_DEVICE, {**stored, "status": new}, status=True))
        await self.settle()

    def stored(self, vm: int) -> dict[str, Any]:
        body = self.kube.stored(kinds.GPU_DEVICE, _name(vm)[1], _name(vm)[0])
        assert body is not None, vm
        return body

    def bound(self, vm: int) -> bool:
        device: GPUDevice | None = self.view.cluster.devices.get(_name(vm))
        return device is not None and device.holds_gpus

    async def settle(self) -> None:
        """The binder's passes until it has nothing left: `Binder.run`'s loop, its wake-up flag read directly
        and without the retry timer, each pass followed by every write it left in flight."""
        for _ in range(1000):
            self.binder.queue.wake.clear()
            waiting = await self.binder.step()
            while writes := asyncio.all_tasks() - {asyncio.current_task()}:
                await asyncio.gather(*writes)
            if not waiting and not self.binder.queue.wake.is_set():
                return
        raise RuntimeError("the binder did not settle in 1000 passes")

    async def sample(self) -> None:
        held: Counter[str] = Counter()
        for d in await self.kube.list(kinds.GPU_DEVICE):
            if d["status"].get("phase") == "Bound":
                held[d["status"]["nodeName"]] += d["spec"]["count"]
        self.f.over += sum(1 for units in held.values() if units > UNITS)
        self.f.held.append(sum(held.values()) / (self.nodes * UNITS))


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:6.1f}%" if whole else "      -"


def _of(counts: Counter[int], size: int) -> int:
    return counts[size] if size else sum(counts.values())


def _ratio(a: float, b: float) -> str:
    return f"{b / a:6.2f}x" if a else "      -"


def report(args: argparse.Namespace, held: float, events: list[Event], without: Figures, with_: Figures) -> None:
    day = [e for e in events if not e.warm]
    kinds_ = Counter(e.kind for e in day)
    print(
        f"a day on {args.nodes} nodes of {UNITS} GPUs (seed {args.seed}): warm-up to {held:.0%} held, then "
        f"{len(day)} events: {kinds_['order']} orders ({args.big:.0%} of 8 GPUs), {kinds_['delete']} deletions, "
        f"{kinds_['stop']} stops, {kinds_['start']} starts; ~{args.stopped:.0%} of VMs stopped"
    )
    print(
        f"units Bound, mean of samples: {statistics.fmean(without.held or [0]):.1%} without idle moves, "
        f"{statistics.fmean(with_.held or [0]):.1%} with (at most {args.moves} moves per decision)"
    )
    print(
        f"{'order size':<12}{'orders':>7}   {'placed at once: without':>24}{'with idle moves':>17}{'ratio':>9}"
        f"   {'placed late: without':>21}{'with':>8}"
    )
    for size in [*range(1, UNITS + 1), 0]:  # 0: all sizes
        orders = _of(without.orders, size)
        a, b = _of(without.at_once, size), _of(with_.at_once, size)
        late = _share(_of(without.late, size), orders), _share(_of(with_.late, size), orders)
        print(
            f"{size or 'all':<12}{orders:>7}   {_share(a, orders):>24}{_share(b, orders):>17}{_ratio(a, b):>9}"
            f"   {late[0]:>21}{late[1]:>8}"
        )
    placed = sum(with_.at_once.values()) + sum(with_.late.values())
    big = with_.at_once[UNITS] + with_.late[UNITS]
    print(
        f"moves made with idle moves: {with_.moves} ({without.moves} without): "
        f"{with_.moves / max(placed, 1):.3f} per placed order ({placed}), "
        f"{with_.moves / max(big, 1):.2f} over the 8-GPU orders placed ({big})"
    )
    c, d = (statistics.median(f.settle) * 1e3 for f in (without, with_))
    p, q = (sorted(f.settle)[int(0.99 * (len(f.settle) - 1))] * 1e3 for f in (without, with_))
    m, n = (statistics.fmean(f.settle) * 1e3 for f in (without, with_))
    print(
        f"binder's settle per order (passes + in-memory writes): p50 {c:.3f} / {d:.3f} ms ({_ratio(c, d).strip()}),"
        f" p99 {p:.3f} / {q:.3f} ms ({_ratio(p, q).strip()}), mean {m:.3f} / {n:.3f} ms ({_ratio(m, n).strip()})"
        f"  (without / with)"
    )
    print(f"the day's wall time: {without.wall:.1f} s without, {with_.wall:.1f} s with")
    print(
        f"checks (without / with): nodes seen over their units {without.over} / {with_.over}, attached devices "
        f"moved {without.moved_attached} / {with_.moved_attached}, VM starts refused "
        f"{without.refused_starts} / {with_.refused_starts}"
    )


def main() -> None:
    settings = Settings()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=200)
    p.add_argument("--events", type=int, default=4000, help="the day's events after the warm-up")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--held",
        type=float,
        nargs="+",
        default=[0.85, 0.95],
        help="the share of units tenants ask for, about: one day at each",
    )
    p.add_argument("--stopped", type=float, default=0.3, help="the share of VMs stopped, about")
    p.add_argument("--big", type=float, default=0.1, help="the share of orders of 8 GPUs")
    p.add_argument("--moves", type=int, default=settings.max_idle_moves, help="idle moves per decision, with")
    args = p.parse_args()
    logs.configure("console", "WARNING")  # the binder's info lines per decision would drown the figures
    for held in args.held:
        events = script(args.seed, args.nodes, args.events, held=held, stopped=args.stopped, big=args.big)
        without = asyncio.run(Day(args.nodes, 0).run(events))
        with_ = asyncio.run(Day(args.nodes, args.moves).run(events))
        report(args, held, events, without, with_)


if __name__ == "__main__":
    main()
