"""Benchmark (issue 18 item 4): one tenant's admissions and /readyz beside another tenant's backlog; a cold backlog.

A. Backlog beside. A local control plane with `--nodes` fake nodes of 8 units of one resource and the
   operator (`cozygpu run --dev`). Tenant B creates `--count` one-device VMIs (a template device of a class
   that fits), one after another, while a thread polls the operator's /readyz every 100 ms (1 s timeout):
   - alone: nothing else happens;
   - beside: tenant A holds `--backlog` GPUDevices Pending (their class selects no node, but names the same
     resource, so their creates pass), and a thread loops create, wait until Bound (2 s at most), delete
     of one placeable held device. Waiting for Bound, rather than deleting at once, makes each cycle cost
     the binder the most: a placement and its write, then a unit freed, which sends it back over the whole
     backlog (any freed unit may now fit a waiting device); a device deleted before it binds skips the first.
   Prints B's create latencies (failed creates included, at the time they failed) and failures, the
   probes' latencies and failures, and the CPU the operator and the API server spent in each phase.
B. Cold backlog (`--cold`, 0 skips it). A fresh control plane with nodes enough for all: `--cold` held
   GPUDevices are created while the operator is stopped, then it starts, timed from its start until all are
   Bound; beside it, as many pending pods asking one unit of an extended resource, timed from
   kube-scheduler's start until all have a node. Both unthrottled, as in bench/binder.py.
Each figure beside its peer from the same run, and the ratio; asserts nothing (shared, noisy machines).
Run: `python bench/backlog.py` (or `--nodes 5000 --count 30 --cold 10000`); loopback only.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import requests
import urllib3
from admission import RESOURCE, pct
from binder import (
    CLASS,
    DEVICES_NS,
    PODS_NS,
    UNITS,
    Tally,
    bound_device,
    bound_pod,
    cpu_seconds,
    device_body,
    pod_body,
    setup,
)
from neighbour import template_vmi

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' harness (tests/support)

from tests.support.harness import OperatorProcess, in_parallel

from cozygpu.api import kinds
from cozygpu.api.names import API_VERSION
from cozygpu.devcluster import binaries, identity, nodes
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import AlreadyExists, ApiError, Body, Kube
from cozygpu.ports import free_port

NOWHERE = "nowhere"  # tenant A's backlog: a class whose nodeSelector matches no node
TENANT_A, TENANT_B = "tenant-a", "tenant-b"
PROBE_EVERY, PROBE_TIMEOUT = 0.1, 1.0  # the probe's own timeout is OperatorProcess.probe's 1 s
CHURN_WAIT = 2.0  # longest the churn waits for its device to be Bound before deleting it
THREADS = 16
BEGAN = time.monotonic()


def say(what: str) -> None:
    """Progress on stderr, the figures stay on stdout: a run of an hour says where it is."""
    print(f"[{time.monotonic() - BEGAN:6.0f}s] {what}", file=sys.stderr, flush=True)


# -- part A ------------------------------------------------------------------------------------


@dataclass
class Phase:
    creates: list[float] = field(default_factory=list)  # seconds, failed creates included
    failures: list[str] = field(default_factory=list)  # why each failed create failed
    examples: dict[str, str] = field(default_factory=dict)  # the first message of each cause
    probes: list[tuple[float, bool]] = field(default_factory=list)  # seconds, answered 200
    cpu: dict[str, float] = field(default_factory=dict)
    wall: float = 0.0


@dataclass
class Churn:
    cycles: int = 0
    bound: int = 0  # cycles whose device was Bound within CHURN_WAIT
    errors: list[str] = field(default_factory=list)


class Prober(threading.Thread):
    """/readyz every PROBE_EVERY, as a kubelet would, until stopped (or an hour, whichever first)."""

    def __init__(self, operator: OperatorProcess, samples: list[tuple[float, bool]]) -> None:
        super().__init__(daemon=True)
        self._operator, self._samples = operator, samples
        self.stop = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + 3600
        while not self.stop.is_set() and time.monotonic() < deadline:
            start = time.perf_counter()
            code, _ = self._operator.probe("/readyz")
            self._samples.append((time.perf_counter() - start, code == 200))
            self.stop.wait(PROBE_EVERY)


def why(e: Exception) -> str:
    """A failed create's cause, short: the API server's webhook timeout is what issue 18 reports."""
    if isinstance(e, ApiError):
        if "did not answer" in e.message:
            return "bind timeout"  # the operator's own: its binder did not answer in time
        if "TLS handshake timeout" in e.message:
            return "webhook TLS handshake timeout"  # the API server's transport gives up at 10 s: nothing answered
        if "deadline exceeded" in e.message or "timeout" in e.message.lower():
            limit = re.search(r"[?&]timeout=(\w+)", e.message)  # the webhook's timeoutSeconds, as the URL says
            return f"webhook timeout ({limit.group(1)})" if limit else "webhook timeout"
        return "refused" if e.status == 403 else f"error {e.status}"
    return "client timeout" if isinstance(e, requests.Timeout) else type(e).__name__


def measure_b(kube: Kube, operator: OperatorProcess, count: int) -> Phase:
    """Tenant B's creates, one after another, with /readyz polled meanwhile."""
    out = Phase()
    prober = Prober(operator, out.probes)
    before, start = cpu_seconds(), time.monotonic()
    prober.start()
    try:
        for _ in range(count):  # each create ends by the client's 30 s timeout at worst
            began = time.perf_counter()
            try:
                kube.create(kinds.VMI, template_vmi(f"b{uuid.uuid4().hex[:8]}", TENANT_B, 1))
            except (ApiError, requests.RequestException) as e:
                out.failures.append(why(e))
                out.examples.setdefault(why(e), str(e))
            out.creates.append(time.perf_counter() - began)
    finally:
        prober.stop.set()
        prober.join(PROBE_TIMEOUT + 5)
    after = cpu_seconds()
    out.wall = time.monotonic() - start
    out.cpu = {name: used - before.get(name, 0.0) for name, used in after.items()}
    return out


def held(name: str, class_name: str) -> Body:
    body = device_body(name, TENANT_A)
    body["spec"]["className"] = class_name
    return body


def churn(kube: Kube, stop: threading.Event, deadline: float, tally: Churn) -> None:
    """Create, wait until Bound (CHURN_WAIT at most), delete one placeable device, until stopped or the deadline."""
    while not stop.is_set() and time.monotonic() < deadline:
        name = f"c{uuid.uuid4().hex[:8]}"
        try:
            kube.create(kinds.GPU_DEVICE, held(name, CLASS))
            until = time.monotonic() + CHURN_WAIT
            while time.monotonic() < until:
                if bound_device(kube.get(kinds.GPU_DEVICE, name, TENANT_A)):
                    tally.bound += 1
                    break
                time.sleep(0.05)
            kube.delete(kinds.GPU_DEVICE, name, TENANT_A)
        except (ApiError, requests.RequestException) as e:
            tally.errors.append(why(e))
            stop.wait(0.1)
        tally.cycles += 1


def create_surely(kube: Kube, kind: kinds.Kind, body: Body, tries: int = 5) -> None:
    """Create, trying again on a failure (a webhook timed out while the binder was busy); one that landed is fine."""
    for attempt in range(tries):
        try:
            kube.create(kind, body)
            return
        except AlreadyExists:
            return  # an earlier try landed after all
        except (ApiError, requests.RequestException):
            if attempt == tries - 1:
                raise
            time.sleep(1)


def poll(what: str, probe: Callable[[], bool], timeout: float, every: float = 2.0) -> float:
    """Poll `probe` every `every` s (lists of thousands of objects: not every 0.1 s); the seconds it took."""
    start = time.monotonic()
    while not probe():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)
    return time.monotonic() - start


def stop_operator(operator: OperatorProcess, grace: float = 30.0) -> str:
    """SIGTERM, then SIGKILL after `grace`; how it went (issue 13 item 5 says SIGTERM ends it with 0)."""
    proc = operator.proc
    if proc is None or proc.poll() is not None:
        return "had already exited"
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=grace)
        said = f"stopped on SIGTERM in {time.monotonic() - start:.1f}s, exit {code}"
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        said = f"did NOT stop on SIGTERM within {grace:.0f}s: killed"
    operator.proc = None
    return said


def count_phase(kube: Kube, phase: str) -> int:
    return sum(1 for d in kube.list(kinds.GPU_DEVICE, TENANT_A) if d.get("status", {}).get("phase") == phase)


def part_a(args: argparse.Namespace, logs: Path) -> None:
    started = time.monotonic()
    alone, beside, spun, setup_took, backlog_took, pending = Phase(), None, Churn(), 0.0, 0.0, 0
    with ControlPlane() as plane:
        kube = plane.kube()
        for ns in (TENANT_A, TENANT_B):
            kube.create(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        for name, selector in ((CLASS, {}), (NOWHERE, {"pool": NOWHERE})):
            kube.create(
                kinds.GPU_CLASS,
                {
                    "apiVersion": API_VERSION,
                    "kind": "GPUClass",
                    "metadata": {"name": name},
                    "spec": {"mode": "passthrough", "resourceName": RESOURCE, "nodeSelector": selector},
                },
            )
        names = [f"bench-{n:05d}" for n in range(args.nodes)]
        in_parallel(plane.kubeconfig_path, names, lambda k, n: nodes.create_gpu_node(k, n, {RESOURCE: UNITS}), THREADS)
        config = identity.write_kubeconfig(plane, plane.workdir / "operator.kubeconfig")
        operator = OperatorProcess(config, logs / "operator-beside.log", "--dev")
        stop, churner = threading.Event(), None
        try:
            say(f"{args.nodes} nodes made; starting the operator")
            operator.start(timeout=300)
            poll("nodes accounted", lambda: len(kube.list(kinds.GPU_NODE)) == args.nodes, timeout=300)
            measure_b(kube, operator, 3)  # warm both the webhook and the binder before measuring
            setup_took = time.monotonic() - started
            say("alone")
            alone = measure_b(kube, operator, args.count)
            if not args.skip_beside:
                start = time.monotonic()
                say(f"creating A's backlog of {args.backlog}")
                bodies = [held(f"a{i:05d}", NOWHERE) for i in range(args.backlog)]
                in_parallel(
                    plane.kubeconfig_path, bodies, lambda k, b: create_surely(k, kinds.GPU_DEVICE, b), THREADS // 2
                )
                with contextlib.suppress(TimeoutError):  # measured anyway: the report says how many were Pending
                    poll(f"{args.backlog} Pending", lambda: count_phase(kube, "Pending") == args.backlog, timeout=900)
                backlog_took, pending = time.monotonic() - start, count_phase(kube, "Pending")
                deadline = time.monotonic() + args.count * 35 + 300  # B's creates end by then at the latest
                churner = threading.Thread(target=churn, args=(plane.kube(), stop, deadline, spun), daemon=True)
                say("beside: the churn starts")
                churner.start()
                with contextlib.suppress(TimeoutError):  # a churn that never cycles shows in the report
                    poll("the churn's first cycle", lambda: spun.cycles > 0, timeout=120, every=0.1)
                beside = measure_b(kube, operator, args.count)
                say("beside done")
        finally:
            stop.set()
            if churner is not None:
                churner.join(CHURN_WAIT + 35)
            said = stop_operator(operator)
            if (plane.workdir / "kube-apiserver.log").exists():  # the plane's workdir goes with it
                shutil.copy(plane.workdir / "kube-apiserver.log", logs / "kube-apiserver-beside.log")
    took = time.monotonic() - started
    report_a(
        args,
        alone,
        beside,
        spun,
        setup_took=setup_took,
        backlog_took=backlog_took,
        pending=pending,
        said=said,
        took=took,
    )


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms"


def secs(seconds: float) -> str:
    return f"{seconds:.1f} s"


def failed(phase: Phase) -> str:
    tally = {k: phase.failures.count(k) for k in sorted(set(phase.failures))}
    return f"{len(phase.failures)}" + (f" ({', '.join(f'{v} {k}' for k, v in tally.items())})" if tally else "")


def probes(phase: Phase) -> str:
    bad = sum(1 for _, ok in phase.probes if not ok)
    slow = sum(1 for s, _ in phase.probes if s > PROBE_TIMEOUT)
    return f"{bad}/{slow}/{len(phase.probes)}"


def latencies(phase: Phase) -> list[float]:
    return [s for s, _ in phase.probes] or [float("nan")]


def report_a(
    args: argparse.Namespace,
    alone: Phase,
    beside: Phase | None,
    spun: Churn,
    *,
    setup_took: float,
    backlog_took: float,
    pending: int,
    said: str,
    took: float,
) -> None:
    print(f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M:%SZ}  nproc {len(os.sched_getaffinity(0))}")
    print(
        f"A. {args.count} one-device VMI creates by tenant B, one at a time, beside tenant A's {args.backlog} "
        f"Pending GPUDevices and a create/Bound/delete loop; {args.nodes} nodes of {UNITS} units"
    )
    print(f"  {'':<36}{'beside':>14}{'alone':>14}{'ratio':>10}")

    def compare(label: str, figure: Callable[[Phase], float], unit: Callable[[float], str] = ms) -> None:
        """One figure beside its peer and the ratio; beside first, as bench/neighbour.py prints."""
        mine, peer = (figure(beside) if beside else None), figure(alone)
        ratio = f"{mine / peer:.2f}x" if mine is not None and peer else "-"
        print(f"  {label:<36}{unit(mine) if mine is not None else '-':>14}{unit(peer):>14}{ratio:>10}")

    def text(label: str, figure: Callable[[Phase], str]) -> None:
        print(f"  {label:<36}{figure(beside) if beside else '-':>14}{figure(alone):>14}")

    compare("B's creates p50", lambda p: statistics.median(p.creates))
    compare("B's creates p99", lambda p: pct(p.creates, 0.99))
    compare("B's creates max", lambda p: max(p.creates))
    text("B's failed creates", failed)
    compare("/readyz p50", lambda p: statistics.median(latencies(p)))
    compare("/readyz p99", lambda p: pct(latencies(p), 0.99))
    compare("/readyz max", lambda p: max(latencies(p)))
    text("/readyz failed/slow (>1 s)/all", probes)
    compare("CPU seconds, operator", lambda p: p.cpu.get("operator", 0.0), secs)
    compare("CPU seconds, kube-apiserver", lambda p: p.cpu.get("kube-apiserver", 0.0), secs)
    compare("phase wall time", lambda p: p.wall, secs)
    if beside is not None:
        errors = f" ({', '.join(sorted(set(spun.errors)))})" if spun.errors else ""
        print(
            f"  the churn: {spun.cycles} cycles, {spun.bound} Bound within {CHURN_WAIT:.0f}s, "
            f"{len(spun.errors)} errors{errors}"
        )
        print(f"  A's {args.backlog} devices created; {pending} Pending {backlog_took:.0f}s after the first create")
    print(f"  setup (nodes, operator ready, warm-up) {setup_took:.0f}s; part A {took:.0f}s in all; operator {said}")
    for name, phase in (("alone", alone), ("beside", beside)):
        if phase is not None:
            print(f"  B's creates {name}, each (s): " + " ".join(f"{c:.1f}" for c in phase.creates))
    for cause, message in {**alone.examples, **(beside.examples if beside else {})}.items():
        print(f"  a {cause}: {message[:300]}")
    sys.stdout.flush()


# -- part B ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cold:
    objects: int
    created_in: float  # creating them, before the clock starts
    bound: int
    took: float  # from the binder's (or scheduler's) start until all bound, or the timeout
    ready_in: float | None  # its health endpoint ok after its start (None: never)
    cpu: dict[str, float]
    said: str  # how it ended

    @property
    def rate(self) -> float:
        return self.bound / self.took


@dataclass(frozen=True)
class Started:
    """A binder just started: wait until it is ready (the seconds since its start, None if never), whether
    it still runs, and stop it (saying how that went)."""

    ready: Callable[[], float | None]
    alive: Callable[[], bool]
    stop: Callable[[], str]


def backlog_then(
    plane: ControlPlane,
    kind: kinds.Kind,
    bodies: list[Body],
    done: Callable[[Body], bool],
    *,
    timeout: float,
    begin: Callable[[], Started],
) -> Cold:
    """Create every body with nothing to bind them; then `begin` the binder, timed from its start until all
    are done, `timeout`, or the binder's exit, whichever first."""
    start = time.monotonic()
    say(f"creating {len(bodies)} {kind.plural}")
    created = in_parallel(plane.kubeconfig_path, bodies, lambda k, b: k.create(kind, b), THREADS)
    say("created; listing")
    tally = Tally(plane.kubeconfig_path, kind, bodies[0]["metadata"]["namespace"], done, len(bodies))
    tally.start()
    tally.watching.wait(120)
    before, began = cpu_seconds(), time.monotonic()
    tally.deadline = began + timeout
    say("starting the binder")
    binder = begin()
    try:
        ready_in = binder.ready()
        say(f"ready after {ready_in}")
        while tally.finished_at is None and time.monotonic() < tally.deadline and binder.alive():
            tally.join(1.0)
        end = tally.finished_at or time.monotonic()
        after = cpu_seconds()
        died = not binder.alive()
        say(f"{len(tally.names)} bound")
    finally:
        said = binder.stop()
    cpu = {name: used - before.get(name, 0.0) for name, used in after.items()}
    said = f"EXITED before the end; {said}" if died and tally.finished_at is None else said
    return Cold(len(bodies), created - start, len(tally.names), end - began, ready_in, cpu, said)


urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)  # kube-scheduler's self-signed /healthz


def scheduler_ready(proc: subprocess.Popen[bytes], port: int, began: float, timeout: float) -> float | None:
    """Seconds from its start until its /healthz answers ok; None if it exited or never did."""
    while time.monotonic() < began + timeout and proc.poll() is None:
        try:
            if requests.get(f"https://127.0.0.1:{port}/healthz", verify=False, timeout=1).status_code == 200:
                return time.monotonic() - began
        except requests.RequestException:
            pass
        time.sleep(0.05)
    return None


def part_b(args: argparse.Namespace, logs: Path) -> None:
    started = time.monotonic()
    count = args.cold
    node_count = max(args.nodes, math.ceil(count / UNITS))
    with ControlPlane() as plane:
        nodes_took = setup(plane, node_count, THREADS)
        config = identity.write_kubeconfig(plane, plane.workdir / "operator.kubeconfig")
        # --no-webhooks as bench/binder.py runs it: kube-scheduler has none to serve either.
        operator = OperatorProcess(config, logs / "operator-cold.log", "--no-webhooks")

        def start_operator() -> Started:
            began = time.monotonic()

            def ready() -> float | None:
                try:
                    operator.start(timeout=args.timeout)
                except RuntimeError:
                    return None  # exited, or never ready: the tally's deadline ends the wait
                return time.monotonic() - began

            return Started(
                ready,
                lambda: operator.proc is not None and operator.proc.poll() is None,
                lambda: stop_operator(operator),
            )

        def start_scheduler() -> Started:
            port = free_port()
            # As bench/binder.py starts it: unthrottled like our operator's client (the defaults, 50 QPS, pace it).
            argv = [
                str(binaries.find(("kube-scheduler",)) / "kube-scheduler"),
                f"--kubeconfig={plane.kubeconfig_path}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                "--kube-api-qps=5000",
                "--kube-api-burst=10000",
                "--v=1",
            ]
            began = time.monotonic()
            scheduler = plane.processes.spawn("kube-scheduler", argv)

            def stop() -> str:
                if scheduler.poll() is not None:
                    return f"had exited with {scheduler.returncode}"
                scheduler.terminate()
                try:
                    return f"stopped on SIGTERM, exit {scheduler.wait(timeout=15)}"
                except subprocess.TimeoutExpired:
                    scheduler.kill()
                    return "did NOT stop on SIGTERM within 15s: killed"

            return Started(
                lambda: scheduler_ready(scheduler, port, began, args.timeout), lambda: scheduler.poll() is None, stop
            )

        try:
            ours = backlog_then(
                plane,
                kinds.GPU_DEVICE,
                [device_body(f"d{i:05d}", DEVICES_NS) for i in range(count)],
                bound_device,
                timeout=args.timeout,
                begin=start_operator,
            )
            theirs = backlog_then(
                plane,
                kinds.POD,
                [pod_body(f"p{i:05d}", PODS_NS) for i in range(count)],
                bound_pod,
                timeout=args.timeout,
                begin=start_scheduler,
            )
        finally:
            stop_operator(operator)
            # The plane's workdir goes with it; its logs say where the time went.
            for name in ("kube-scheduler.log", "kube-apiserver.log"):
                if (plane.workdir / name).exists():
                    shutil.copy(plane.workdir / name, logs / name)
    took = time.monotonic() - started
    print(
        f"B. cold backlog: {count} objects created first, 1 unit each; {node_count} nodes of {UNITS} units "
        f"made in {nodes_took:.0f}s; part B {took:.0f}s in all"
    )
    for name, side in (("ours", ours), ("kube-scheduler", theirs)):
        if side.bound < side.objects:
            print(f"  {name}: TIMED OUT with {side.bound} of {side.objects} bound")
    print(f"  {'':<46}{'ours (devices)':>16}{'kube-scheduler':>16}{'ours/sched':>12}")
    rows = [
        ("seconds from start until all bound", ours.took, theirs.took),
        ("bound per second", ours.rate, theirs.rate),
        (
            "CPU seconds, the operator or kube-scheduler",
            ours.cpu.get("operator", 0.0),
            theirs.cpu.get("kube-scheduler", 0.0),
        ),
        *[(f"CPU seconds, {n}", ours.cpu.get(n, 0.0), theirs.cpu.get(n, 0.0)) for n in ("kube-apiserver", "etcd")],
        ("seconds creating them (before the clock)", ours.created_in, theirs.created_in),
    ]
    for label, mine, peer in rows:
        print(f"  {label:<46}{mine:>16.1f}{peer:>16.1f}{mine / peer if peer else float('nan'):>12.2f}")
    for name, side in (("the operator's /readyz", ours), ("kube-scheduler's /healthz", theirs)):
        ready = f"{side.ready_in:.1f}s" if side.ready_in is not None else "never"
        print(f"  {name} ok {ready} after its start; it {side.said}")
    sys.stdout.flush()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--count", type=int, default=30, help="tenant B's VMI creates in each phase")
    p.add_argument("--backlog", type=int, default=1000, help="tenant A's Pending GPUDevices")
    p.add_argument("--cold", type=int, default=10000, help="objects of the cold backlog a side; 0 skips it")
    p.add_argument("--skip-beside", action="store_true", help="part A's alone phase only")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds each cold side may take")
    p.add_argument("--log-dir", type=Path, help="kept logs of the operator (default: a temp dir)")
    args = p.parse_args()
    logs: Path = args.log_dir or Path(tempfile.mkdtemp(prefix="cozygpu-bench-backlog-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(f"logs in {logs}")
    # A SIGTERM (make, a CI timeout) unwinds like Ctrl-C: the operator is no child the control plane reaps.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    part_a(args, logs)
    if args.cold:
        part_b(args, logs)


if __name__ == "__main__":
    main()
