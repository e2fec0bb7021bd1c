"""Benchmark (§10, issue 21 item 6): failover, leader killed -> first bind answered by its successor.

On a local control plane: `--nodes` fake GPU nodes and `--devices` held GPUDevices, Bound (as
bench/scale.py builds them). Two replicas start, each with its own identity, competing for a
Lease of `--lease-duration` seconds; the standby keeps its view warm. The leader is killed with
SIGKILL at the worst moment, right after a renewal of the Lease is seen (the standby then times a
whole term from the renewal, issue 33 item 2), a held device is created, and the clock runs from
that renewal until the device is Bound by the successor. Prints that beside the term plus the
retry period (§10's bound: a standby must wait out the dead leader's term, and sees its last
renewal within a retry period) and the ratio, and each replica's resident memory (each holds a
view). Asserts nothing.
Run: `make bench` (or `python bench/failover.py --nodes 1000 --devices 10000`); loopback only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scale import NAMESPACES, populate, rss_mib

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' harness (tests/support)

from tests.support.harness import OperatorProcess, wait_for

from cozygpu.api import kinds
from cozygpu.api.names import API_VERSION
from cozygpu.decisions.leadership import retry_period
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.devcluster.identity import NAMESPACE
from cozygpu.runtime.process.leadership import LEASE


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--devices", type=int, default=50000)
    p.add_argument("--lease-duration", type=int, default=15)
    p.add_argument("--timeout", type=float, default=1800.0)
    args = p.parse_args()
    with ControlPlane() as plane, tempfile.TemporaryDirectory() as tmp:
        kube = plane.kube()
        config = populate(plane, Path(tmp), args.nodes, args.devices, args.timeout)
        lease = ("--no-webhooks", "--lease-name", "bench-failover", "--lease-namespace", NAMESPACE)
        lease += ("--lease-duration", str(args.lease_duration))
        a = OperatorProcess(config, Path(tmp) / "a.log", "--identity", "replica-a", *lease).start(timeout=args.timeout)
        b = OperatorProcess(config, Path(tmp) / "b.log", "--identity", "replica-b", *lease).start(timeout=args.timeout)
        assert a.proc is not None and b.proc is not None
        wait_for("a leads", lambda: a.events("operator.deciding"), timeout=args.timeout)
        memory = (rss_mib(a.proc.pid), rss_mib(b.proc.pid))
        probe = {
            "apiVersion": API_VERSION,
            "kind": "GPUDevice",
            "metadata": {"name": "failover-probe", "namespace": f"t{NAMESPACES - 1}"},
            "spec": {"className": "gpu", "count": 1},
        }

        def bound() -> bool:
            body = kube.get_or_none(kinds.GPU_DEVICE, "failover-probe", f"t{NAMESPACES - 1}") or {}
            return (body.get("status") or {}).get("phase") == "Bound"

        lists = len(b.events("watch.listed"))
        start = _renewed(kube, "bench-failover", args.timeout)
        a.kill()
        kube.create(kinds.GPU_DEVICE, probe)
        while not bound():
            if time.monotonic() - start > args.timeout:
                raise SystemExit("the successor bound nothing")
            time.sleep(0.05)
        failover = time.monotonic() - start
        lists = len(b.events("watch.listed")) - lists
        b.stop()
    term = dt.timedelta(seconds=args.lease_duration)
    bound_by = (term + retry_period(term)).total_seconds()
    size = f"at {args.nodes} nodes, {args.devices} devices"
    print(f"{size:<52}{'measured':>10}{'term + retry':>14}{'ratio':>8}")
    label = "failover: last renewal, killed -> a bind answered (s)"
    print(f"{label:<52}{failover:>10.1f}{bound_by:>14.1f}{failover / bound_by:>8.2f}")
    print(f"{'resident memory, leader / standby (MiB)':<48}{memory[0]:>5.0f} / {memory[1]:<5.0f}")
    print(f"  lists by the successor between the kill and the bind: {lists} (0: its view was warm)")


def _renewed(kube: Any, name: str, timeout: float) -> float:
    """Watch the Lease's renewTime until it changes; the monotonic time it was seen to (at most 20 ms late)."""

    def renew_time() -> str:
        lease = kube.get_or_none(LEASE, name, NAMESPACE) or {}
        return str((lease.get("spec") or {}).get("renewTime") or "")

    before, start = renew_time(), time.monotonic()
    while renew_time() == before:
        if time.monotonic() - start > timeout:
            raise SystemExit("the leader never renewed its Lease")
        time.sleep(0.02)
    return time.monotonic()


if __name__ == "__main__":
    main()
