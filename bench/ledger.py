"""Benchmark (§7.4 across replicas, §14): one tenant's held-device create beside another tenant's burst of them.

On a local control plane with the operator (`cozygpu run --dev`, its own identity), both namespaces under a
GPUBudget, so every create goes through the order ledger (runtime/ledger.py):
- alone: `--count` creates in `quiet`, one after another, each timed;
- beside: the same, while `--burst` clients in `noisy` create held devices without pause;
- and beside the same burst, one create in `open` after each in `quiet`: a namespace no budget covers, whose
  creates never meet the ledger. What `quiet` pays beyond `open` is the ledger's; what both pay beyond alone
  is the machine's two cores, shared with the burst.
Prints p50 and p99 of the quiet tenant's creates beside and alone, the ratio, the same for `open` beside the
burst against `quiet` beside it, and how many of them and of the burst's failed (an error, not a refusal: the
budgets are generous); asserts nothing.
Run: `make bench` (or `python bench/ledger.py`).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

from admission import fill, pct, row

from cozygpu.api import kinds
from cozygpu.api.names import API_VERSION
from cozygpu.devcluster import identity
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.devcluster.harness import OperatorProcess, wait_for
from cozygpu.kube.adapter import ApiError, Kube


def held(name: str, namespace: str) -> dict:
    return {
        "apiVersion": API_VERSION,
        "kind": "GPUDevice",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"className": "bench", "count": 1},
    }


def quiet_creates(kube: Kube, count: int, failed: list[str], namespaces: tuple[str, ...] = ("quiet",)) -> list[float]:
    """Each create's duration, one after another, taking the namespaces in turn (the durations in the same
    turn); each created device deleted again (the budget stays open)."""
    out = []
    for i in range(count * len(namespaces)):
        namespace = namespaces[i % len(namespaces)]
        name = f"q{uuid.uuid4().hex[:8]}"
        start = time.perf_counter()
        try:
            kube.create(kinds.GPU_DEVICE, held(name, namespace))
        except ApiError as e:
            failed.append(e.message)
            continue
        finally:
            out.append(time.perf_counter() - start)
        kube.delete(kinds.GPU_DEVICE, name, namespace)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--count", type=int, default=60)
    p.add_argument("--burst", type=int, default=32)
    p.add_argument("--nodes", type=int, default=50)
    args = p.parse_args()
    with ControlPlane() as plane, tempfile.TemporaryDirectory() as tmp:
        kube = plane.kube()
        fill(kube, args.nodes, ("quiet", "noisy", "open"))
        for ns in ("quiet", "noisy"):
            kube.create(
                kinds.GPU_BUDGET,
                {
                    "apiVersion": API_VERSION,
                    "kind": "GPUBudget",
                    "metadata": {"name": "generous", "namespace": ns},
                    "spec": {"limits": {"bench": 1_000_000}},
                },
            )
        config = identity.write_kubeconfig(plane, Path(tmp) / "operator")
        operator = OperatorProcess(config, Path(tmp) / "operator.log", "--dev").start()
        alone_failed: list[str] = []
        beside_failed: list[str] = []
        burst_made, burst_failed = [0], [0]
        try:
            wait_for("nodes accounted", lambda: len(kube.list(kinds.GPU_NODE)) == args.nodes, timeout=60)
            quiet_creates(kube, 5, [])  # warm: the ledger exists, the connections are open
            alone = quiet_creates(kube, args.count, alone_failed)
            noisy = threading.Event()
            noisy.set()

            def flood() -> None:
                client = plane.kube()
                while noisy.is_set():
                    try:
                        client.create(kinds.GPU_DEVICE, held(f"n{uuid.uuid4().hex[:10]}", "noisy"))
                        burst_made[0] += 1
                    except ApiError:
                        burst_failed[0] += 1

            threads = [threading.Thread(target=flood) for _ in range(args.burst)]
            for t in threads:
                t.start()
            time.sleep(1)  # the burst under way
            both = quiet_creates(kube, args.count, beside_failed, ("quiet", "open"))
            beside, unbudgeted = both[0::2], both[1::2]
            noisy.clear()
            for t in threads:
                t.join()
        finally:
            operator.stop()
    print(
        f"held-device creates under a GPUBudget, {args.count} one after another, beside {args.burst} clients"
        " creating without pause in another namespace"
    )
    print(f"{'':<28}{'beside':>13}{'alone':>15}{'ratio':>11}")
    row("p50", statistics.median(beside), statistics.median(alone))
    row("p99", pct(beside, 0.99), pct(alone, 0.99))
    print(f"{'':<28}{'quiet':>13}{'open':>15}{'ratio':>11}   (beside the burst; open: no budget, no ledger)")
    row("p50", statistics.median(beside), statistics.median(unbudgeted))
    row("p99", pct(beside, 0.99), pct(unbudgeted, 0.99))
    print(
        f"failed: {len(beside_failed)} beside, {len(alone_failed)} alone; the burst made {burst_made[0]} devices,"
        f" {burst_failed[0]} of its creates failed"
    )
    for message in sorted(set(beside_failed + alone_failed))[:3]:
        print(f"  e.g. {message[:200]}")


if __name__ == "__main__":
    main()
