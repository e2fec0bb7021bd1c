"""Benchmark (§6.6, issue 22 item 4): the GPU cost of a VM start through KubeVirt (target: <= 0.5 s added at p99).

On KubeVirt's tier of the local control plane (tests/support/kubevirt.py, as tests/kubevirt runs it):
kube-apiserver, kube-scheduler, KubeVirt's own virt-api and virt-controller, the fake kubelet and
virt-handler (cozygpu.devcluster.kubelet), and the operator with its webhooks (`cozygpu run --dev`, its own
ServiceAccount under the chart's RBAC). Fake nodes as virt-handler leaves them, each with room for every VM.

Measured: from a VirtualMachine's create (the call sent) to its virt-launcher pod bound to a node, i.e.
`spec.nodeName` set by kube-scheduler's binding (seen on one watch of launcher pods across the cluster),
for `--concurrency` VMs created at once (or, with `--rate`, at a steady rate: §13.4's shape, KubeVirt's
performance lanes', 100 VMs at 10 a second), each with one held GPU (a GPUDevice the tenant holds, Bound
before the rounds) and one template GPU (a device template in the VM, made at the VMI's admission);
beside the same VMs without GPUs (no device annotation), in the same process and cluster. The two kinds
alternate within each of `--rounds` rounds (which kind goes first alternates too), every VM of a batch
deleted (KubeVirt stops it), and its VMI, pod and template device gone, before the next batch. One untimed
warm-up batch of each kind first. Prints p50 and p99 of each kind, the difference and the ratio, and the
same for three legs, each as a second watch (of VMIs) and the pods' watch saw them: create to VMI made
(virt-controller, virt-api's webhook and ours, which makes and binds the template device), VMI made to pod
made (virt-controller's render, our pod webhook), pod made to bound (kube-scheduler). VMs without GPUs meet
none of our webhooks (their object selectors and match conditions): that column is KubeVirt's own floor.
Then the operator's own mean answer times in the timed rounds, from its /metrics histograms: its VMI
webhook is called once a VMI (its configuration sorts after virt-api's, so nothing changes the VMI after it). Read
with it: virt-controller creates VMIs from 3 workers (its default --vm-controller-threads), so with 20 VMs
at once a VMI's admission time is waited for again by the VMs queued behind it.
Last, what each kind costs the machine per VM started and stopped (its batch and its clean-up, timed rounds):
the API server's writes (POST, PUT, PATCH, DELETE, from its apiserver_request_total) and the CPU seconds of
every process here (this one and those it started: etcd, kube-apiserver, kube-scheduler, virt-api,
virt-controller, the operator), side by side; on a machine whose cores the burst fills, the added time
follows these. And per VM started, from virt-controller's own metrics: its VM workers' busy seconds, its VMI
create's mean (every webhook in it, ours too) and its VMI patches per VM; in the lane's shape its 3 VM workers
are the queue, so these say where a GPU VM's added time is spent.
p99 is the sample at rank floor(0.99 n): of 100, the slowest. Asserts nothing.
Run: `make bench` (or `python bench/vmstart.py --rounds 2`); loopback only.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' harness (tests/support)

from tests.support import vms
from tests.support.bodies import gpu_class_body, gpu_device_body
from tests.support.harness import OperatorProcess, wait_for
from tests.support.kubevirt import Nodes, kubevirt_operator
from tests.support.nodes import fresh_gpu

from cozygpu.api import kinds
from cozygpu.api.kinds import Kind
from cozygpu.api.names import ANNOTATION_DEVICES, LABEL_DEVICE_REFERENCE
from cozygpu.devcluster import binaries, identity
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import ApiError, Body, Kube
from cozygpu.kube.watch import Watch

NAMESPACE = "tenant"
LAUNCHER = "kubevirt.io=virt-launcher"  # virt-controller's label on every launcher pod
VM_NAME = "vm.kubevirt.io/name"  # and the VMI's (so the VM's) name
OF_A_VM = "kubevirt.io/vm"  # every VMI here: the label on the VM's template (tests/support/vms.py)
TARGET = 0.5  # seconds added at p99 (issue 22 item 4)
LANE = 1.25  # §13.4: in the lane's shape, GPU VMs' p99 at most this times the VMs' without GPUs


class Seen:
    """One watch of a kind across the cluster (resumed if the server ends it): when each VM's object was first
    seen, and first seen bound to a node (`spec.nodeName`, pods only)."""

    def __init__(self, kube: Kube, kind: Kind, selector: str, key: str | None = None) -> None:
        """`key`: the label naming the object's VM; else its name."""
        self.made: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self._kube, self._kind, self._selector, self._key = kube, kind, selector, key
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._watch: Watch | None = None
        self._thread = threading.Thread(target=self._loop, name=f"{kind.kind}-watch", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._closed.is_set():
            with contextlib.suppress(ApiError, OSError):  # the stream cut: list and watch again
                items, version = self._kube.list_versioned(self._kind, label_selector=self._selector)
                for item in items:
                    self._saw(item, time.monotonic())
                self._watch = self._kube.watch(self._kind, version, label_selector=self._selector, timeout=1800)
                for kind, item in self._watch:
                    if kind in ("ADDED", "MODIFIED"):
                        self._saw(item, time.monotonic())

    def _saw(self, item: Body, at: float) -> None:
        meta = item.get("metadata") or {}
        vm = (meta.get("labels") or {}).get(self._key) if self._key else meta.get("name")
        if vm is None:
            return
        with self._lock:
            self.made.setdefault(vm, at)
            if (item.get("spec") or {}).get("nodeName"):
                self.bound.setdefault(vm, at)

    def made_at(self, vm: str) -> float | None:
        with self._lock:
            return self.made.get(vm)

    def bound_at(self, vm: str) -> float | None:
        with self._lock:
            return self.bound.get(vm)

    def close(self) -> None:
        self._closed.set()
        if self._watch is not None:
            self._watch.close()


def plain(body: Body) -> Body:
    """The same VM without GPUs: no device annotation nor label on its template."""
    meta = body["spec"]["template"]["metadata"]
    meta["annotations"].pop(ANNOTATION_DEVICES)
    meta["labels"].pop(LABEL_DEVICE_REFERENCE)
    return body


Start = tuple[float, float, float]  # seconds from the VM's create to its VMI seen, its pod seen, its pod bound


def batch(
    clients: list[Kube], seen: tuple[Seen, Seen], names: list[str], gpu_cls: str | None, rate: float | None = None
) -> list[Start]:
    """Create one VM per name, all at once or `rate` a second; wait until every launcher pod is bound. Each VM's
    Start."""
    vmis, pods = seen
    sent: dict[str, float] = {}
    began = time.monotonic()

    def create(i: int) -> None:
        if rate:
            time.sleep(max(0.0, began + i / rate - time.monotonic()))  # a steady stream, as KubeVirt's lanes make
        name = names[i]
        if gpu_cls is None:
            body = plain(vms.vm_body(name, NAMESPACE, []))
        else:
            body = vms.vm_body(name, NAMESPACE, [vms.held(f"held-{i:02d}"), vms.template(gpu_cls)])
        sent[name] = time.monotonic()
        clients[i % len(clients)].create(kinds.VM, body)

    with concurrent.futures.ThreadPoolExecutor(len(clients)) as pool:
        list(pool.map(create, range(len(names))))
    wait_for(f"{len(names)} launcher pods bound", lambda: all(pods.bound_at(n) for n in names), timeout=120)
    # The VMIs' own watch may lag the pods' (its stream cut and listed again): every VMI seen there too.
    wait_for(f"{len(names)} VMIs seen", lambda: all(vmis.made_at(n) for n in names), timeout=30)
    return [(vmis.made[n] - sent[n], pods.made[n] - sent[n], pods.bound[n] - sent[n]) for n in names]


REQUESTS = re.compile(r'^apiserver_request_total\{(.*verb="(?:POST|PUT|PATCH|DELETE)".*)\} (\S+)$')


def api_writes(kube: Kube) -> float:
    """The writes the API server has answered so far, from its own counter."""
    return sum(float(m[2]) for line in kube.raw_get("/metrics").text.splitlines() if (m := REQUESTS.match(line)))


def cpu_seconds() -> float:
    """CPU seconds used so far by this process and every process it started, and theirs."""
    parents: dict[int, int] = {}
    used: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            parents[int(entry.name)] = int(fields[1])
            used[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    ours, todo = set(), [os.getpid()]
    while todo:
        pid = todo.pop()
        ours.add(pid)
        todo += [child for child, parent in parents.items() if parent == pid and child not in ours]
    return sum(used.get(pid, 0.0) for pid in ours)


def clean(kube: Kube, names: list[str], gpu: bool) -> None:
    """Delete the batch's VMs; wait until their VMIs, launcher pods and template devices are gone."""
    for name in names:
        kube.delete(kinds.VM, name, NAMESPACE)

    def done() -> bool:
        left = {p["metadata"].get("labels", {}).get(VM_NAME) for p in kube.list(kinds.POD, NAMESPACE)}
        left |= {v["metadata"]["name"] for v in kube.list(kinds.VMI, NAMESPACE)}
        left |= {v["metadata"]["name"] for v in kube.list(kinds.VM, NAMESPACE)}
        if gpu:
            left |= {d["metadata"]["name"].rsplit("-gpu-", 1)[0] for d in kube.list(kinds.GPU_DEVICE, NAMESPACE)}
        return not left.intersection(names)

    wait_for("the batch's VMs, VMIs, pods and template devices gone", done, timeout=120)


def pct(samples: list[float], q: float) -> float:
    return sorted(samples)[min(len(samples) - 1, int(q * len(samples)))]


@contextlib.contextmanager
def cluster(directory: Path) -> Iterator[tuple[ControlPlane, OperatorProcess] | None]:
    """KubeVirt's tier of the control plane and the operator on it; None where KubeVirt cannot be had."""
    plane = ControlPlane(kubevirt=True)
    try:
        plane.start(timeout=180)
    except binaries.KubeVirtUnavailable as e:
        print(f"vmstart: skipped: {e}; see the README (KUBEVIRT_SRC or KUBEVIRT_ASSETS)")
        yield None
        return
    # The tier's fixture generator; its teardown (the operator stopped) runs on its next step, also after an error,
    # and before the control plane stops: an operator left without its API server retries its cleanup for good.
    operator = kubevirt_operator(plane, directory)
    try:
        yield plane, next(operator)
    finally:
        next(operator, None)
        plane.stop()


SERIES = re.compile(r'^cozygpu_(admission|bind)_duration_seconds_(sum|count)\{(?:.*webhook="([^"]+)")?.*\} (\S+)$')


def answers(operator: OperatorProcess, token: str) -> dict[str, list[float]]:
    """The operator's own latency histograms (its /metrics, §10): [sum, count] by webhook, and of binds."""
    got: dict[str, list[float]] = {}
    for line in operator.metrics(token).text.splitlines():
        if m := SERIES.match(line):
            entry = got.setdefault(f"{m[3]} webhook" if m[1] == "admission" else "bind", [0.0, 0.0])
            entry[m[2] == "count"] += float(m[4])
    return got


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument(
        "--rate", type=float, default=None, help="create the VMs this many a second instead of at once (§13.4's lane)"
    )
    args = p.parse_args()
    started = time.monotonic()
    n = args.concurrency
    samples: dict[str, list[Start]] = {"gpu": [], "plain": []}
    costs: dict[str, list[float]] = {"gpu": [0.0, 0.0], "plain": [0.0, 0.0]}  # API writes, CPU seconds
    work: dict[str, dict[str, float]] = {"gpu": {}, "plain": {}}  # virt-controller's, while its VMs start
    with tempfile.TemporaryDirectory() as tmp, cluster(Path(tmp)) as up:
        if up is None:
            return
        plane, operator = up
        kube = plane.kube()
        token = identity.metrics_token(kube)
        ready = time.monotonic() - started
        gpu = fresh_gpu()
        kube.create(kinds.GPU_CLASS, gpu_class_body(gpu.cls, gpu.resource))
        kube.create(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        made = Nodes(kube, gpu)
        for _ in range(args.nodes):
            made.add(2 * n)  # room on each for every VM's two devices, however the held ones are placed
        for i in range(n):
            kube.create(kinds.GPU_DEVICE, gpu_device_body(f"held-{i:02d}", NAMESPACE, gpu.cls))
        for i in range(n):
            vms.bound(kube, NAMESPACE, f"held-{i:02d}")
        clients = [plane.kube() for _ in range(n)]
        seen = (Seen(kube, kinds.VMI, OF_A_VM), Seen(kube, kinds.POD, LAUNCHER, VM_NAME))
        try:
            for r in range(args.rounds + 1):  # round 0 warms up, untimed
                order = ("gpu", "plain") if r % 2 == 0 else ("plain", "gpu")
                for kind in order:
                    names = [f"{kind}-{r}-{i:02d}" for i in range(n)]
                    before = (api_writes(kube), cpu_seconds())
                    at_start = controller_work(plane)
                    got = batch(clients, seen, names, gpu.cls if kind == "gpu" else None, args.rate)
                    if r > 0:
                        for key, value in controller_work(plane).items():
                            work[kind][key] = work[kind].get(key, 0.0) + value - at_start.get(key, 0.0)
                    clean(kube, names, kind == "gpu")
                    if r > 0:
                        samples[kind] += got
                        costs[kind][0] += api_writes(kube) - before[0]
                        costs[kind][1] += cpu_seconds() - before[1]
                if r == 0:
                    warm = answers(operator, token)
        finally:
            for watch in seen:
                watch.close()
        spent = {
            k: [v[0] - warm.get(k, [0.0, 0.0])[0], v[1] - warm.get(k, [0.0, 0.0])[1]]
            for k, v in answers(operator, token).items()
        }
    report(samples, spent, args, ready, time.monotonic() - started)
    machine(costs, {k: len(v) for k, v in samples.items()})
    explain(work, {k: len(v) for k, v in samples.items()})


def machine(costs: dict[str, list[float]], n: dict[str, int]) -> None:
    """What each kind cost the machine per VM started and stopped: API writes, CPU seconds of every process."""
    per_vm = {k: [v / max(1, n[k]) for v in c] for k, c in costs.items()}
    print(f"{'per VM started and stopped, mean':<32}{'GPU VMs':>10}{'no GPUs':>10}{'added':>10}{'ratio':>9}")
    side_by_side("  API writes", per_vm["gpu"][0], per_vm["plain"][0])
    side_by_side("  CPU seconds, every process", per_vm["gpu"][1], per_vm["plain"][1], "s")


def side_by_side(label: str, ours: float, peer: float, unit: str = "") -> None:
    print(
        f"{label:<32}{ours:>8.2f}{unit:<2}{peer:>8.2f}{unit:<2}{ours - peer:>8.2f}{unit:<2}"
        f"{ours / peer if peer else float('nan'):>8.2f}x"
    )


def controller_work(plane: ControlPlane) -> dict[str, float]:
    assert plane.kubevirt is not None
    return plane.kubevirt.controller_work()


def explain(work: dict[str, dict[str, float]], n: dict[str, int]) -> None:
    """Where the lane's queue comes from: virt-controller makes every VM's VMI from 3 VM workers, and each
    worker waits for the VMI's create (every webhook in it, ours too) and for its patches, e.g. taking back
    the VMI's node pin (§3) under KubeVirt's LiveUpdate rollout."""
    print(f"{'per VM started, virt-controller':<32}{'GPU VMs':>10}{'no GPUs':>10}{'added':>10}{'ratio':>9}")
    ours, peer = (
        [
            work[k].get("work", 0.0) / max(1, n[k]),
            work[k].get("CREATE sum", 0.0) / max(1.0, work[k].get("CREATE count", 0.0)) * 1e3,
            work[k].get("PATCH count", 0.0) / max(1, n[k]),
        ]
        for k in ("gpu", "plain")
    )
    side_by_side("  VM workers' busy seconds", ours[0], peer[0], "s")
    side_by_side("  its VMI create, mean", ours[1], peer[1], "ms")
    side_by_side("  its VMI patches", ours[2], peer[2])


def row(label: str, ours: float, peer: float) -> None:
    print(f"{label:<30}{ours * 1e3:>7.0f} ms{peer * 1e3:>7.0f} ms{(ours - peer) * 1e3:>7.0f} ms{ours / peer:>7.2f}x")


def report(
    samples: dict[str, list[Start]], spent: dict[str, list[float]], args: argparse.Namespace, ready: float, took: float
) -> None:
    gpu, none = ([s[2] for s in samples[k]] for k in ("gpu", "plain"))
    shape = f"{args.rate:g} a second" if args.rate else "at once"
    print(f"VM start through KubeVirt: create to launcher pod bound (kube-scheduler), {args.concurrency} VMs {shape}")
    print(f"x {args.rounds} rounds each kind, alternating; GPU VMs: 1 held + 1 template GPU each")
    print(f"{'':<30}{'GPU VMs':>10}{'no GPUs':>10}{'added':>10}{'ratio':>8}")
    row("p50", pct(gpu, 0.5), pct(none, 0.5))
    row("p99", pct(gpu, 0.99), pct(none, 0.99))
    legs = (
        ("create to VMI made", lambda s: s[0]),
        ("VMI made to pod made", lambda s: s[1] - s[0]),
        ("pod made to bound", lambda s: s[2] - s[1]),
    )
    for label, leg in legs:
        for q in (0.5, 0.99):
            row(f"  {label}, p{q * 100:.0f}", *(pct([leg(s) for s in samples[k]], q) for k in ("gpu", "plain")))
    means = [f"{k} {v[0] / v[1] * 1e3:.0f} ms ({v[1]:.0f})" for k, v in sorted(spent.items()) if v[1]]
    print("the operator's own answers in the timed rounds, mean (its /metrics): " + ", ".join(means))
    added = pct(gpu, 0.99) - pct(none, 0.99)
    verdict = "within" if added <= TARGET else "over"
    print(f"target: <= {TARGET * 1e3:.0f} ms added at p99; {added * 1e3:.0f} ms, {verdict} it")
    if args.rate:
        ratio = pct(gpu, 0.99) / pct(none, 0.99)
        met = "met" if ratio <= LANE else "NOT met"
        print(f"§13.4 (a steady stream): p99 <= {LANE:.2f}x the VMs without GPUs; {ratio:.2f}x, {met}")
    print(f"samples: {len(gpu)} + {len(none)}; cluster ready in {ready:.0f} s, whole run {took:.0f} s")


if __name__ == "__main__":
    main()
