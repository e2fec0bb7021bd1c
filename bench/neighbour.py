"""Benchmark (issue 12 item 2): one VMI's admission beside another tenant's largest.

On a local control plane with the operator (`cozygpu run --dev`):
- alone: `--count` creates, one after another, of a VMI with one template device;
- beside: the same, while another tenant keeps creating VMIs with as many template
  devices as one VMI may list (`--max-devices`, the operator's cap), each of which the
  binder refuses (no node holds the set) and the webhook undoes: 3 x N API writes each.
Prints p50 and p99 of the small creates beside and alone, the ratio, and what the large
admissions cost; asserts nothing.
Run: `make bench` (or `python bench/neighbour.py`).
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
from cozygpu.devcluster import bodies, identity
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import ApiError, Kube


def template_vmi(name: str, namespace: str, devices: int) -> dict:
    return bodies.vmi_body(name, namespace, [{"deviceTemplate": {"className": "bench", "count": 1}}] * devices)


def small_creates(kube: Kube, namespace: str, count: int) -> list[float]:
    """Each create's duration, one after another."""
    out = []
    for _ in range(count):
        start = time.perf_counter()
        kube.create(kinds.VMI, template_vmi(f"s{uuid.uuid4().hex[:8]}", namespace, 1))
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--count", type=int, default=40)
    p.add_argument("--max-devices", type=int, default=64)
    p.add_argument("--nodes", type=int, default=100)
    args = p.parse_args()
    with ControlPlane() as plane, tempfile.TemporaryDirectory() as tmp:
        kube = plane.kube()
        fill(kube, args.nodes, ("alone", "beside", "large"))
        config = identity.write_kubeconfig(plane, Path(tmp) / "operator")
        operator = OperatorProcess(
            config, Path(tmp) / "operator.log", "--dev", "--max-devices-per-vmi", str(args.max_devices)
        ).start()
        large: list[tuple[float, str]] = []
        stop = threading.Event()

        def neighbour() -> None:
            client = plane.kube()
            while not stop.is_set():
                start = time.perf_counter()
                try:
                    client.create(kinds.VMI, template_vmi(f"l{uuid.uuid4().hex[:8]}", "large", args.max_devices))
                    result = "admitted"
                except ApiError as e:
                    result = "refused" if e.status == 403 else "error"
                large.append((time.perf_counter() - start, result))

        try:
            wait_for("nodes accounted", lambda: len(kube.list(kinds.GPU_NODE)) == args.nodes, timeout=60)
            small_creates(kube, "alone", 5)  # warm both paths before measuring
            alone = small_creates(kube, "alone", args.count)
            thread = threading.Thread(target=neighbour)
            thread.start()
            wait_for("the neighbour's first admission", lambda: bool(large), timeout=120)
            beside = small_creates(kube, "beside", args.count)
            stop.set()
            thread.join()
        finally:
            operator.stop()
    print(f"one-device VMI creates ({args.count}, one at a time) beside a tenant's {args.max_devices}-device VMIs")
    print(f"{'':<28}{'beside':>13}{'alone':>15}{'ratio':>11}")
    row("p50", statistics.median(beside), statistics.median(alone))
    row("p99", pct(beside, 0.99), pct(alone, 0.99))
    outcomes = {r: sum(1 for _, x in large if x == r) for r in ("admitted", "refused", "error")}
    print(
        f"the neighbour's {args.max_devices}-device creates: "
        + ", ".join(f"{v} {k}" for k, v in outcomes.items())
        + f"; median {statistics.median(d for d, _ in large) * 1e3:.0f} ms each"
    )


if __name__ == "__main__":
    main()
