"""Benchmark (§13.6, issue 37 item 7): what a node's drain costs its GPU VMs, beside the same VMs' plain restart.

On KubeVirt's tier of the local control plane (as tests/kubevirt runs it): kube-apiserver, kube-scheduler,
KubeVirt's own virt-api (its eviction admitter included) and virt-controller, the fake kubelet and virt-handler,
and the operator with its webhooks (`cozygpu run --dev`). Two fake nodes, A and B, each with room for every VM;
`--vms` VMs (eviction strategy External), each with one held GPU and one template GPU, running on one of them.

Each round, in turn (which goes first alternates):
- plain: every VM restarted at once as `virtctl restart` asks it (its VM's status.stateChangeRequests: Stop
  this VMI, then Start); per VM, from the request to its next VMI Running on a node;
- drain: the VMs' node drained as `kubectl drain` does it (cordoned, then the Eviction API for every launcher,
  asked again every poll while refused); per VM, from its launcher's first eviction to its next VMI Running on
  the other node (its set moved there before it stopped, §6.8). The node is uncordoned after, so the next
  drain goes the other way.
The operator runs with at most `--vms` evacuations at once, per node and in all, so the figure is one VM's cost,
not the pacing's (a drain of more VMs than the limits goes in waves; the chart's defaults are 2 and 5).
Prints p50 and p99 of each, the difference and the ratio; target (§13.6): drain p99 <= plain p99 + 2 s.
p99 is the sample at rank floor(0.99 n). Asserts nothing.
Run: `make bench` (or `python bench/drain.py --vms 10 --rounds 3`); loopback only.
"""

from __future__ import annotations

import argparse
import contextlib
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
from tests.support.kubevirt import Nodes
from tests.support.nodes import fresh_gpu

from cozygpu.api import kinds
from cozygpu.devcluster import binaries, identity
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import Kube

NAMESPACE = "tenant"
TARGET = 2.0  # seconds a drain may add at p99 to a plain restart (§13.6)


def pct(samples: list[float], q: float) -> float:
    return sorted(samples)[min(len(samples) - 1, int(q * len(samples)))]


@contextlib.contextmanager
def cluster(directory: Path, vms_at_once: int) -> Iterator[tuple[ControlPlane, OperatorProcess] | None]:
    """KubeVirt's tier and the operator on it, evacuating up to `vms_at_once` VMs at once; None without KubeVirt."""
    plane = ControlPlane(kubevirt=True)
    try:
        plane.start(timeout=180)
    except binaries.KubeVirtUnavailable as e:
        print(f"drain: skipped: {e}; see the README (KUBEVIRT_SRC or KUBEVIRT_ASSETS)")
        yield None
        return
    try:
        kubeconfig = identity.write_kubeconfig(plane, directory / "kubeconfig")
        limits = ("--evacuations-per-node", str(vms_at_once), "--evacuations", str(vms_at_once))
        operator = OperatorProcess(kubeconfig, directory / "operator.log", "--dev", "--bind-timeout", "5", *limits)
        operator.start()
        try:
            yield plane, operator
        finally:
            operator.stop()
    finally:
        plane.stop()


class Running:
    """Polls the namespace's VMIs: when each VM's next VMI (another uid than the one it had) first ran, and where."""

    def __init__(self, kube: Kube, before: dict[str, str]) -> None:
        self.at: dict[str, tuple[float, str]] = {}
        self._kube, self._before = kube, before
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._done.is_set() and len(self.at) < len(self._before):
            now = time.monotonic()
            for vmi in self._kube.list(kinds.VMI, NAMESPACE):
                name, status = vmi["metadata"]["name"], vmi.get("status") or {}
                fresh = vmi["metadata"]["uid"] != self._before.get(name)
                if name not in self.at and fresh and status.get("phase") == "Running" and status.get("nodeName"):
                    self.at[name] = (now, status["nodeName"])
            time.sleep(0.05)

    def wait(self, timeout: float = 300.0) -> None:
        wait_for("every VM running again", lambda: len(self.at) == len(self._before), timeout)
        self._done.set()


def uids(kube: Kube, names: list[str]) -> dict[str, str]:
    return {name: vms.running(kube, NAMESPACE, name)[0]["metadata"]["uid"] for name in names}


def plain_restarts(kube: Kube, names: list[str]) -> list[float]:
    before = uids(kube, names)
    watch = Running(kube, before)
    asked: dict[str, float] = {}
    for name in names:
        requests = [{"action": "Stop", "uid": before[name]}, {"action": "Start"}]
        kube.patch(kinds.VM, name, {"status": {"stateChangeRequests": requests}}, NAMESPACE, subresource="status")
        asked[name] = time.monotonic()
    watch.wait()
    return [watch.at[name][0] - asked[name] for name in names]


def drain(kube: Kube, names: list[str], node: str) -> list[float]:
    before = uids(kube, names)
    watch = Running(kube, before)
    kube.patch(kinds.NODE, node, {"spec": {"unschedulable": True}})
    first: dict[str, float] = {}

    def empty() -> bool:
        pods = [p for p in kube.list(kinds.POD, NAMESPACE) if p["spec"].get("nodeName") == node]
        for pod in pods:
            vm = pod["metadata"].get("labels", {}).get("vm.kubevirt.io/name", "")
            first.setdefault(vm, time.monotonic())
            kube.evict(pod["metadata"]["name"], NAMESPACE)
        return not pods

    wait_for(f"node {node} drained", empty, timeout=300)
    watch.wait()
    kube.patch(kinds.NODE, node, {"spec": {"unschedulable": False}})
    moved = [name for name in names if watch.at[name][1] == node]
    if moved:
        raise SystemExit(f"drain: VMs still on the drained node {node}: {moved}")
    return [watch.at[name][0] - first[name] for name in names]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vms", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    n = args.vms
    samples: dict[str, list[float]] = {"plain": [], "drain": []}
    with tempfile.TemporaryDirectory() as tmp, cluster(Path(tmp), n) as up:
        if up is None:
            return
        plane, _ = up
        kube = plane.kube()
        gpu = fresh_gpu()
        kube.create(kinds.GPU_CLASS, gpu_class_body(gpu.cls, gpu.resource))
        kube.create(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        made = Nodes(kube, gpu)
        nodes = [made.add(2 * n), made.add(2 * n)]  # room on each for every VM's two devices
        names = [f"vm-{i:02d}" for i in range(n)]
        for name in names:
            kube.create(kinds.GPU_DEVICE, gpu_device_body(f"{name}-held", NAMESPACE, gpu.cls))
            body = vms.vm_body(name, NAMESPACE, [vms.held(f"{name}-held"), vms.template(gpu.cls)], eviction="External")
            kube.create(kinds.VM, body)
        for name in names:
            vms.running(kube, NAMESPACE, name, timeout=120)
        for r in range(args.rounds):
            order = ("plain", "drain") if r % 2 == 0 else ("drain", "plain")
            for kind in order:
                if kind == "plain":
                    samples["plain"] += plain_restarts(kube, names)
                else:
                    home = {vms.running(kube, NAMESPACE, name)[0]["status"]["nodeName"] for name in names}
                    source = sorted(home)[0] if len(home) == 1 else nodes[0]
                    samples["drain"] += drain(kube, names, source)
            print(f"round {r + 1}: {n} VMs restarted, then drained (or the reverse)", flush=True)
    plain, drained = samples["plain"], samples["drain"]
    print(f"\n{n} GPU VMs (one held, one template GPU each), {args.rounds} rounds, {len(drained)} samples each")
    print(f"{'':<36}{'drain':>10}{'plain restart':>16}{'difference':>12}{'ratio':>8}")
    for label, q in (("from eviction / restart to running, p50", 0.5), ("the same, p99", 0.99)):
        ours, peer = pct(drained, q), pct(plain, q)
        print(f"{label:<36}{ours:>9.2f}s{peer:>15.2f}s{ours - peer:>11.2f}s{ours / peer:>8.2f}")
    added = pct(drained, 0.99) - pct(plain, 0.99)
    verdict = "met" if added <= TARGET else "NOT met"
    print(f"§13.6: drain p99 <= plain restart p99 + {TARGET:.0f} s: {verdict} ({added:+.2f} s)")


if __name__ == "__main__":
    main()
