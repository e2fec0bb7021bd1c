"""Benchmark (§13.3): the operator's memory, cold start and resync at a large cloud's size.

On a local control plane: `--nodes` fake GPU nodes and `--devices` held GPUDevices, Bound
by the operator itself (as in a running cloud). Then the operator is started again from
nothing and measured: seconds from start to ready (/readyz, the view synced), its resident
memory once ready and after its first resync, its peak (VmHWM), and how long that resync took
(its own `view.resynced` log event). Prints each figure beside its §13.3 budget; asserts nothing.
With `--sizes`, each size on a fresh control plane, then the table nodes x devices -> memory
that the chart's resources are sized from (docs/operating.md, "Sizing").
Run: `make bench` (or `python bench/scale.py --nodes 500 --devices 5000`); loopback only.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' harness (tests/support)

from tests.support.harness import OperatorProcess, in_parallel, wait_for

from cozygpu.api import kinds
from cozygpu.api.names import API_VERSION
from cozygpu.devcluster import identity, nodes
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import Kube

RESOURCE = "example.com/gpu"
UNITS = 16
NAMESPACES = 100
T = TypeVar("T")


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    """Resident memory now (VmRSS) or at its peak so far (VmHWM), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def bound_count(kube: Kube) -> int:
    return sum(1 for d in kube.list(kinds.GPU_DEVICE) if d.get("status", {}).get("phase") == "Bound")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--devices", type=int, default=50000)
    p.add_argument("--sizes", default="", help="NODES:DEVICES,...: each measured, then the sizing table")
    p.add_argument("--timeout", type=float, default=1800.0)
    args = p.parse_args()
    sizes = [tuple(int(x) for x in s.split(":")) for s in args.sizes.split(",") if s] or [(args.nodes, args.devices)]
    for n, d in sizes:
        if d > n * UNITS:
            p.error(f"{d} devices do not fit {n} nodes of {UNITS} units")
    rows = [measure(n, d, args.timeout) for n, d in sizes]
    if len(rows) > 1:
        print(f"\n{'nodes':>8}{'devices':>10}{'ready MiB':>12}{'resynced MiB':>14}{'peak MiB':>10}{'ready s':>9}")
        for row in rows:
            print(f"{row[0]:>8}{row[1]:>10}{row[2]:>12.0f}{row[3]:>14.0f}{row[4]:>10.0f}{row[5]:>9.1f}")


def populate(plane: ControlPlane, tmp: Path, nodes_: int, devices: int, timeout: float) -> Path:
    """A cloud of `nodes_` fake GPU nodes and `devices` held GPUDevices, Bound by an operator that is then stopped;
    returns the operator's kubeconfig (bench/failover.py starts from the same cloud)."""
    args = argparse.Namespace(nodes=nodes_, devices=devices, timeout=timeout)
    kube = plane.kube()
    kube.create(
        kinds.GPU_CLASS,
        {
            "apiVersion": API_VERSION,
            "kind": "GPUClass",
            "metadata": {"name": "gpu"},
            "spec": {"mode": "passthrough", "resourceName": RESOURCE},
        },
    )
    for ns in range(NAMESPACES):
        kube.create(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"t{ns}"}})
    start = time.monotonic()
    in_parallel(
        plane.kubeconfig_path,
        [f"node-{n:05d}" for n in range(args.nodes)],
        lambda k, name: nodes.create_gpu_node(k, name, {RESOURCE: UNITS}),
    )
    print(f"{args.nodes} nodes in {time.monotonic() - start:.0f}s", flush=True)
    config = identity.write_kubeconfig(plane, tmp / "operator")
    filler = OperatorProcess(config, tmp / "filler.log", "--no-webhooks").start(timeout=args.timeout)
    start = time.monotonic()
    bodies = [
        {
            "apiVersion": API_VERSION,
            "kind": "GPUDevice",
            "metadata": {"name": f"d{i:06d}", "namespace": f"t{i % NAMESPACES}"},
            "spec": {"className": "gpu", "count": 1},
        }
        for i in range(args.devices)
    ]
    in_parallel(plane.kubeconfig_path, bodies, lambda k, body: k.create(kinds.GPU_DEVICE, body))
    while bound_count(kube) < args.devices:  # a list of every device: seconds apart, not a busy poll
        if time.monotonic() - start > args.timeout:
            raise SystemExit(f"not every device Bound after {args.timeout}s")
        time.sleep(5)
    print(f"{args.devices} devices created and Bound in {time.monotonic() - start:.0f}s", flush=True)
    filler.stop()

    return config


def measure(nodes_: int, devices: int, timeout: float) -> tuple[int, int, float, float, float, float]:
    """One size on a fresh control plane; (nodes, devices, MiB ready, MiB after a resync, peak MiB, s to ready)."""
    args = argparse.Namespace(nodes=nodes_, devices=devices, timeout=timeout)
    with ControlPlane() as plane, tempfile.TemporaryDirectory() as tmp:
        config = populate(plane, Path(tmp), args.nodes, args.devices, args.timeout)

        cold = OperatorProcess(config, Path(tmp) / "cold.log", "--no-webhooks", "--sweep-interval", "30")
        start = time.monotonic()
        cold.start(timeout=args.timeout)
        ready = time.monotonic() - start
        assert cold.proc is not None
        at_ready = rss_mib(cold.proc.pid)
        resyncs = wait_for("the first periodic resync", lambda: cold.events("view.resynced")[1:], timeout=120)
        after = rss_mib(cold.proc.pid)
        peak = rss_mib(cold.proc.pid, "VmHWM")
        cold.stop()
    print(f"{'at ' + str(args.nodes) + ' nodes, ' + str(args.devices) + ' devices':<40}{'measured':>12}{'budget':>10}")
    print(f"{'cold start to ready (s)':<40}{ready:>12.1f}{30:>10}")
    print(f"{'resident memory once ready (MiB)':<40}{at_ready:>12.0f}{400:>10}")
    print(f"{'resident memory after a resync (MiB)':<40}{after:>12.0f}{400:>10}")
    print(f"{'peak resident memory (MiB)':<40}{peak:>12.0f}{'':>10}")
    print(f"{'a resync of every kind (s)':<40}{resyncs[0]['duration_ms'] / 1000:>12.1f}{'':>10}")
    print(f"  that resync: {resyncs[0].get('unchanged')} objects unchanged, {resyncs[0]['forgotten']} forgotten")
    return nodes_, devices, at_ready, after, peak, ready


if __name__ == "__main__":
    main()
