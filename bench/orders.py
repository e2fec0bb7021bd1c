"""Benchmark (§7.4, §13.5): one tenant's held-device create beside another tenant's burst of them.

On a local control plane with the operator (`cozygpu run --dev`, its own identity): `quiet` and `noisy` each under
a GPUBudget of its own (generous: nothing is refused), so each create is charged to its namespace's budget
(runtime/charges.py); `open` under none, so its creates are charged nowhere.
- alone: `--count` creates in `quiet` and as many in `open`, taking turns, one after another, each timed;
- beside: the same, while `--burst` clients in `noisy` create held devices without pause.
Prints p50 and p99 of `quiet` against `open` beside the burst (§13.5: what a tenant who shares no budget with the
burst pays beyond a namespace no budget covers), the same alone, `quiet` beside against alone, the burst's
devices per second, and how many creates failed (an error, not a refusal); asserts nothing. The bench runs on the
code before issue 36 too (the shared order ledger), for docs/performance.md's before and after.
Run: `make bench` (or `python bench/orders.py`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from admission import fill, pct, row

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' harness (tests/support)

from tests.support.harness import OperatorProcess, wait_for

from cozygpu.api import kinds
from cozygpu.api.names import API_VERSION
from cozygpu.devcluster import identity
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import ApiError, Conflict, Kube


def held(name: str, namespace: str) -> dict:
    return {
        "apiVersion": API_VERSION,
        "kind": "GPUDevice",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"className": "bench", "count": 1},
    }


def probe_write(kube: Kube, value: int) -> float:
    """One status write of the `probe` budget, timed; read again and tried again if the accountant wrote first."""
    while True:
        probe = kube.get(kinds.GPU_BUDGET, "generous", "probe")
        probe["status"] = {**(probe.get("status") or {}), "orderedTotal": value}
        start = time.perf_counter()
        try:
            kube.replace_status(kinds.GPU_BUDGET, probe)
        except Conflict:
            continue
        return time.perf_counter() - start


def creates(kube: Kube, count: int, failed: list[str]) -> tuple[list[float], list[float], list[float]]:
    """Each create's duration in `quiet` and in `open`, taking turns, one after another (each created device deleted
    again: the budget stays open); and after each, one status write of the budget in `probe` that no order spends,
    the API write a charge to a budget makes, made by this client with nothing deciding."""
    out: dict[str, list[float]] = {"quiet": [], "open": [], "probe": []}
    for i in range(count * 2):
        namespace = ("quiet", "open")[i % 2]
        name = f"q{uuid.uuid4().hex[:8]}"
        start = time.perf_counter()
        try:
            kube.create(kinds.GPU_DEVICE, held(name, namespace))
        except ApiError as e:
            failed.append(e.message)
            continue
        finally:
            out[namespace].append(time.perf_counter() - start)
        kube.delete(kinds.GPU_DEVICE, name, namespace)
        if namespace == "open":
            out["probe"].append(probe_write(kube, i))
    return out["quiet"], out["open"], out["probe"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--count", type=int, default=60)
    p.add_argument("--burst", type=int, default=32)
    p.add_argument("--nodes", type=int, default=50)
    args = p.parse_args()
    with ControlPlane() as plane, tempfile.TemporaryDirectory() as tmp:
        kube = plane.kube()
        fill(kube, args.nodes, ("quiet", "noisy", "open", "probe"))
        for ns in ("quiet", "noisy", "probe"):
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
            creates(kube, 5, [])  # warm: the connections are open, the budgets written once
            quiet_alone, open_alone, _ = creates(kube, args.count, alone_failed)
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
            made, started = burst_made[0], time.perf_counter()
            quiet_beside, open_beside, probe_beside = creates(kube, args.count, beside_failed)
            rate = (burst_made[0] - made) / (time.perf_counter() - started)
            noisy.clear()
            for t in threads:
                t.join()
        finally:
            operator.stop()
    report(args, (quiet_beside, open_beside), (quiet_alone, open_alone), rate)
    print(
        f"{'beside the burst':<28}{'quiet':>13}{'open + write':>15}{'ratio':>11}   (open's create, then a status write)"
    )
    floor = [o + p for o, p in zip(open_beside, probe_beside, strict=False)]
    row("floor p50", statistics.median(quiet_beside), statistics.median(floor))
    row("floor p99", pct(quiet_beside, 0.99), pct(floor, 0.99))
    print(f"{'budget status write p50 ms':<28}{statistics.median(probe_beside) * 1e3:>10.2f}")
    print(
        f"failed: {len(beside_failed)} beside, {len(alone_failed)} alone; the burst made {burst_made[0]} devices,"
        f" {burst_failed[0]} of its creates failed"
    )
    for message in sorted(set(beside_failed + alone_failed))[:3]:
        print(f"  e.g. {message[:200]}")


def report(
    args: argparse.Namespace,
    beside: tuple[list[float], list[float]],
    alone: tuple[list[float], list[float]],
    rate: float,
) -> None:
    """Each figure beside its peer, and the ratio; `beside` and `alone` are (quiet, open)."""
    (quiet_beside, open_beside), (quiet_alone, open_alone) = beside, alone
    print(
        f"held-device creates, {args.count} in each namespace taking turns, alone and beside {args.burst} clients"
        " creating without pause in `noisy` (its own budget)"
    )
    print(f"{'beside the burst':<28}{'quiet':>13}{'open':>15}{'ratio':>11}   (quiet: its own budget; open: none)")
    row("beside p50", statistics.median(quiet_beside), statistics.median(open_beside))
    row("beside p99", pct(quiet_beside, 0.99), pct(open_beside, 0.99))
    print(f"{'alone':<28}{'quiet':>13}{'open':>15}{'ratio':>11}")
    row("alone p50", statistics.median(quiet_alone), statistics.median(open_alone))
    row("alone p99", pct(quiet_alone, 0.99), pct(open_alone, 0.99))
    print(f"{'quiet':<28}{'beside':>13}{'alone':>15}{'ratio':>11}")
    row("quiet p50", statistics.median(quiet_beside), statistics.median(quiet_alone))
    row("quiet p99", pct(quiet_beside, 0.99), pct(quiet_alone, 0.99))
    print(f"burst devices/s  {rate:.1f}")
    # Each ratio on a row of its own, for bench/before_after.py, which reads a row's first figure.
    for label, ours, peer in (
        ("quiet/open beside p50", statistics.median(quiet_beside), statistics.median(open_beside)),
        ("quiet/open beside p99", pct(quiet_beside, 0.99), pct(open_beside, 0.99)),
        ("open beside p50 ms", statistics.median(open_beside), 1e-3),
        ("open beside p99 ms", pct(open_beside, 0.99), 1e-3),
    ):
        print(f"{label:<28}{ours / peer:>10.2f}")


if __name__ == "__main__":
    main()
