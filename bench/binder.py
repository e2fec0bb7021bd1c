"""Benchmark: the binder against kube-scheduler, the same work on the same nodes of a local control plane.

Prints figures; asserts nothing (these machines are shared and noisy). N fake nodes carry 8 units
of two extended resources: held GPUDevices ask one unit of the first and our operator binds them;
pods ask one unit of the second and kube-scheduler binds them. One side runs at a time, the other
stopped, so they share neither units nor CPU. Each side is timed from its first create until
every object is bound (Bound phase, or spec.nodeName), next to the rate of creation alone and
the CPU each process spent meanwhile, which tell what bounds what.
Run: `python bench/binder.py` (or `--nodes 5000 --devices 20000`); loopback only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pykube
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' harness (tests/support)

from tests.support.harness import OperatorProcess, in_parallel, wait_for

from cozygpu.api import kinds
from cozygpu.api.names import API_VERSION
from cozygpu.devcluster import binaries, identity, nodes
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import ApiError, Body, Kube
from cozygpu.ports import free_port

DEVICE_RESOURCE = "example.com/gpu"
POD_RESOURCE = "example.com/pod-gpu"
UNITS = 8
CLASS = "bench"
DEVICES_NS, PODS_NS, WARMUP_NS = "bench-devices", "bench-pods", "bench-warmup"
CPU_ROWS = ("kube-apiserver", "etcd", "bench")  # bench: this script's clients and watch
Done = Callable[[Body], bool]


@dataclass(frozen=True)
class Side:
    objects: int
    created_in: float  # first create sent to last create answered
    bound: int
    bound_in: float  # first create sent to the last object bound (or the timeout)
    tail: float  # last create answered to the last object bound
    cpu: dict[str, float]  # CPU seconds each process used meanwhile

    def cpu_of(self, name: str) -> float:
        return self.cpu.get(name, 0.0)

    @property
    def create_rate(self) -> float:
        return self.objects / self.created_in

    @property
    def bind_rate(self) -> float:
        return self.bound / self.bound_in


def cpu_seconds() -> dict[str, float]:
    """CPU seconds used so far by this process ("bench") and its children, by name; a child python is the operator."""
    me, tick = os.getpid(), os.sysconf("SC_CLK_TCK")
    used: dict[str, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # ended meanwhile
        name, fields = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
        if int(stat.parent.name) == me or int(fields[1]) == me:
            key = "bench" if int(stat.parent.name) == me else "operator" if name.startswith("python") else name
            used[key] = used.get(key, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return used


class Tally(threading.Thread):
    """Counts the objects of a namespace that are done, from one watch: polling lists of 20k objects would
    cost the API server (and this 2-core box) more than the work measured."""

    def __init__(self, kubeconfig: Path, kind: kinds.Kind, namespace: str, done: Done, target: int) -> None:
        super().__init__(daemon=True)
        self._kube = Kube.from_kubeconfig(kubeconfig)
        self._api = pykube.HTTPClient(pykube.KubeConfig.from_file(str(kubeconfig)))
        self._kind, self._namespace, self._done, self._target = kind, namespace, done, target
        self.deadline = float("inf")
        self.names: set[str] = set()
        self.finished_at: float | None = None
        self.watching = threading.Event()

    def run(self) -> None:
        # A watch that ends early (server timeout, 410 Gone) is followed by a fresh list and watch.
        while self.finished_at is None and time.monotonic() < self.deadline:
            try:
                items, version = self._kube.list_versioned(self._kind, self._namespace)
                self.names = {i["metadata"]["name"] for i in items if self._done(i)}
                self._note()
                self.watching.set()
                self._follow(version)
            except (ApiError, requests.RequestException, OSError):
                time.sleep(0.5)  # the API server is busy, or gone after a timed-out side: the deadline ends it

    def _follow(self, version: str) -> None:
        left = self.deadline - time.monotonic() if self.deadline != float("inf") else 3600.0
        params = {"watch": "true", "resourceVersion": version, "timeoutSeconds": str(max(1, int(left)))}
        with self._api.get(
            version=self._kind.api_version,
            url=self._kind.plural,
            namespace=self._namespace,
            params=params,
            stream=True,
            timeout=(10, None),
        ) as response:
            for line in response.iter_lines():
                event = json.loads(line) if line else {}
                if event.get("type") == "ERROR":
                    return
                if event.get("type") in ("ADDED", "MODIFIED") and self._done(event["object"]):
                    self.names.add(event["object"]["metadata"]["name"])
                    if self._note():
                        return

    def _note(self) -> bool:
        if self.finished_at is None and len(self.names) >= self._target:
            self.finished_at = time.monotonic()
        return self.finished_at is not None


def measure(
    plane: ControlPlane, kind: kinds.Kind, bodies: list[Body], done: Done, *, threads: int, timeout: float
) -> Side:
    """Create the bodies concurrently and wait until all are done; the timings of that."""
    namespace = bodies[0]["metadata"]["namespace"]
    tally = Tally(plane.kubeconfig_path, kind, namespace, done, len(bodies))
    tally.start()
    tally.watching.wait(30)
    before, start = cpu_seconds(), time.monotonic()
    tally.deadline = start + timeout
    created = in_parallel(plane.kubeconfig_path, bodies, lambda kube, body: kube.create(kind, body), threads)
    tally.join(max(0.0, tally.deadline - time.monotonic()))
    end = tally.finished_at or time.monotonic()
    after = cpu_seconds()
    cpu = {name: used - before.get(name, 0.0) for name, used in after.items()}
    return Side(len(bodies), created - start, len(tally.names), end - start, end - created, cpu)


def device_body(name: str, namespace: str) -> Body:
    return {
        "apiVersion": API_VERSION,
        "kind": "GPUDevice",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"className": CLASS, "count": 1},
    }


def pod_body(name: str, namespace: str) -> Body:
    one = {POD_RESOURCE: "1"}  # extended resources: requests must equal limits
    container = {"name": "c", "image": "registry.invalid/pause", "resources": {"requests": one, "limits": one}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [container]},
    }


def bound_device(body: Body) -> bool:
    return bool(body.get("status", {}).get("phase") == "Bound")


def bound_pod(body: Body) -> bool:
    return bool(body.get("spec", {}).get("nodeName"))


def warm_up(kube: Kube, kind: kinds.Kind, body: Body, done: Done, timeout: float) -> None:
    """One object bound before the clock starts: the binder or scheduler is up and its caches are synced."""
    kube.create(kind, body)
    meta = body["metadata"]
    wait_for(f"{meta['name']} bound", lambda: done(kube.get(kind, meta["name"], meta["namespace"])), timeout)


def setup(plane: ControlPlane, node_count: int, threads: int) -> float:
    """Namespaces, the class and the nodes; the seconds the nodes took."""
    kube = plane.kube()
    for ns in (DEVICES_NS, PODS_NS, WARMUP_NS):
        kube.create(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    kube.create(
        kinds.GPU_CLASS,
        {
            "apiVersion": API_VERSION,
            "kind": "GPUClass",
            "metadata": {"name": CLASS},
            "spec": {"mode": "passthrough", "resourceName": DEVICE_RESOURCE},
        },
    )
    units = {DEVICE_RESOURCE: UNITS, POD_RESOURCE: UNITS}
    start = time.monotonic()
    names = [f"node-{n:05d}" for n in range(node_count)]
    end = in_parallel(plane.kubeconfig_path, names, lambda k, name: nodes.create_gpu_node(k, name, units), threads)
    return end - start


def operator_side(plane: ControlPlane, logs: Path, count: int, threads: int, timeout: float) -> Side:
    kubeconfig = identity.write_kubeconfig(plane, plane.workdir / "operator.kubeconfig")
    operator = OperatorProcess(kubeconfig, logs / "operator.log", "--no-webhooks")
    try:
        operator.start(timeout=timeout)
        warm_up(plane.kube(), kinds.GPU_DEVICE, device_body("warmup", WARMUP_NS), bound_device, timeout)
        bodies = [device_body(f"d{i:05d}", DEVICES_NS) for i in range(count)]
        return measure(plane, kinds.GPU_DEVICE, bodies, bound_device, threads=threads, timeout=timeout)
    finally:
        operator.stop()


def scheduler_side(plane: ControlPlane, count: int, threads: int, timeout: float) -> Side:
    argv = [
        str(binaries.find(("kube-scheduler",)) / "kube-scheduler"),
        f"--kubeconfig={plane.kubeconfig_path}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={free_port()}",
        # Unthrottled like our operator's client; the defaults (50 QPS) would pace it.
        "--kube-api-qps=5000",
        "--kube-api-burst=10000",
        "--v=1",
    ]
    scheduler = plane.processes.spawn("kube-scheduler", argv)
    try:
        warm_up(plane.kube(), kinds.POD, pod_body("warmup", WARMUP_NS), bound_pod, timeout)
        bodies = [pod_body(f"p{i:05d}", PODS_NS) for i in range(count)]
        return measure(plane, kinds.POD, bodies, bound_pod, threads=threads, timeout=timeout)
    finally:
        scheduler.terminate()
        try:
            scheduler.wait(timeout=15)
        except subprocess.TimeoutExpired:
            scheduler.kill()


def report(args: argparse.Namespace, nodes_took: float, ours: Side, theirs: Side, logs: Path) -> None:
    cpus = len(os.sched_getaffinity(0))  # what `nproc` prints
    print(f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M:%SZ}  nproc {cpus}  logs in {logs}")
    print(
        f"{args.nodes} nodes ({UNITS} units of each resource) made in {nodes_took:.1f}s; "
        f"{args.devices} objects a side, 1 unit each, {args.threads} client threads"
    )
    for name, side in (("ours", ours), ("kube-scheduler", theirs)):
        if side.bound < side.objects:
            print(f"  {name}: TIMED OUT with {side.bound} of {side.objects} bound")
    rows = [
        ("bound per second (first create to all bound)", ours.bind_rate, theirs.bind_rate),
        ("created per second (creates alone)", ours.create_rate, theirs.create_rate),
        ("seconds from first create to all bound", ours.bound_in, theirs.bound_in),
        ("seconds after the last create answered", ours.tail, theirs.tail),
        ("CPU seconds, the binder or kube-scheduler", ours.cpu_of("operator"), theirs.cpu_of("kube-scheduler")),
        *[(f"CPU seconds, {name}", ours.cpu_of(name), theirs.cpu_of(name)) for name in CPU_ROWS],
    ]
    print(f"{'work':<46}{'ours (devices)':>16}{'kube-scheduler':>16}{'ours/sched':>12}")
    for label, mine, peer in rows:
        print(f"{label:<46}{mine:>16.1f}{peer:>16.1f}{mine / peer if peer else float('nan'):>12.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--devices", type=int, default=5000, help="objects a side: GPUDevices, then as many pods")
    p.add_argument("--threads", type=int, default=16, help="client threads creating objects")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds each side may take")
    p.add_argument("--log-dir", type=Path, help="kept logs of the operator and kube-scheduler (default: a temp dir)")
    args = p.parse_args()
    if args.devices + 1 > args.nodes * UNITS:  # +1: the warm-up object
        p.error(f"{args.devices} devices do not fit {args.nodes} nodes of {UNITS} units")
    logs: Path = args.log_dir or Path(tempfile.mkdtemp(prefix="cozygpu-bench-binder-"))
    logs.mkdir(parents=True, exist_ok=True)

    with ControlPlane() as plane:
        try:
            nodes_took = setup(plane, args.nodes, args.threads)
            ours = operator_side(plane, logs, args.devices, args.threads, args.timeout)
            theirs = scheduler_side(plane, args.devices, args.threads, args.timeout)
        finally:
            # The plane's workdir goes with it; its logs say where the API server's time went.
            for name in ("kube-scheduler.log", "kube-apiserver.log"):
                if (plane.workdir / name).exists():
                    shutil.copy(plane.workdir / name, logs / name)
    report(args, nodes_took, ours, theirs, logs)


if __name__ == "__main__":
    main()
