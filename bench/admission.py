"""Benchmark (§13.2): VMI admission latency against the floor of its own chain of API writes.

On a local control plane with the operator (`cozygpu run --dev`, its own identity):
- `--concurrency` tenants at once each create a VMI with two template devices, for
  `--rounds` rounds; the latency of each create, p50 and p99;
- the floor: the same chain of API calls an admission makes, without the operator,
  on ConfigMaps (two fresh reads, two creates, two writes for attach, request and the binder's answer,
  one per device as on the Lease holder, then the object itself), at the same concurrency;
- the same stream in a namespace under a GPUBudget (generous: nothing is refused), beside the stream
  without one: what charging the budget costs a bind (§7.4 across replicas, runtime/charges.py);
- a burst of `--burst` creates at once: admitted, refused, timed out (bind timeout).
Prints each figure beside its peer and the ratio; asserts nothing.
Run: `make bench` (or `python bench/admission.py --rounds 5`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' harness (tests/support)

from tests.support.harness import OperatorProcess, wait_for

from cozygpu.api import kinds
from cozygpu.api.names import API_VERSION
from cozygpu.devcluster import bodies, identity, nodes
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import ApiError, Body, Kube

RESOURCE = "example.com/bench-gpu"
CONFIGMAP = kinds.kind("ConfigMap")


def vmi_body(name: str, namespace: str) -> Body:
    """A VMI with two template devices of the bench's class."""
    return bodies.vmi_body(name, namespace, [{"deviceTemplate": {"className": "bench", "count": 1}}] * 2)


def fill(kube: Kube, node_count: int, namespaces: tuple[str, ...]) -> None:
    """The bench's cloud: nodes of 8 units each, the class `bench`, and the namespaces."""
    for n in range(node_count):
        nodes.create_gpu_node(kube, f"bench-{n:04d}", {RESOURCE: 8})
    kube.create(
        kinds.GPU_CLASS,
        {
            "apiVersion": API_VERSION,
            "kind": "GPUClass",
            "metadata": {"name": "bench"},
            "spec": {"mode": "passthrough", "resourceName": RESOURCE},
        },
    )
    for ns in namespaces:
        kube.create(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})


def chain_of_writes(kube: Kube, name: str, namespace: str) -> None:
    """What one admission costs in API calls, with nothing deciding in between."""
    parts = [f"{name}-gpu-0", f"{name}-gpu-1"]
    for part in parts:
        kube.get_or_none(CONFIGMAP, part, namespace)
    made = [
        kube.create(
            CONFIGMAP,
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": p, "namespace": namespace}, "data": {}},
        )
        for p in parts
    ]
    # The request and its answer, one write per device, as the Lease holder's webhook and binder make it (§13.4).
    for body in made:
        body["data"] = {**(body.get("data") or {}), "request": "x", "answer": "x"}
        kube.replace(CONFIGMAP, body)
    kube.create(
        CONFIGMAP, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace}}
    )


def latencies(clients: list[Kube], work: Callable[[Kube, str], None], count: int) -> list[float]:
    """Run `count` calls of `work`, len(clients) at a time; each call's duration."""

    def one(i: int) -> float:
        start = time.perf_counter()
        work(clients[i % len(clients)], f"b{uuid.uuid4().hex[:8]}")
        return time.perf_counter() - start

    with concurrent.futures.ThreadPoolExecutor(len(clients)) as pool:
        return list(pool.map(one, range(count)))


def pct(samples: list[float], q: float) -> float:
    return sorted(samples)[min(len(samples) - 1, int(q * len(samples)))]


def row(label: str, ours: float, floor: float) -> None:
    print(f"{label:<28}{ours * 1e3:>10.0f} ms{floor * 1e3:>12.0f} ms{ours / floor:>10.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--concurrency", type=int, default=20)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--burst", type=int, default=100)
    p.add_argument("--nodes", type=int, default=100)
    args = p.parse_args()
    with ControlPlane() as plane, tempfile.TemporaryDirectory() as tmp:
        kube = plane.kube()
        fill(kube, args.nodes, ("floor", "ours", "budgeted", "burst"))
        kube.create(
            kinds.GPU_BUDGET,
            {
                "apiVersion": API_VERSION,
                "kind": "GPUBudget",
                "metadata": {"name": "generous", "namespace": "budgeted"},
                "spec": {"limits": {"bench": 1_000_000}},
            },
        )
        clients = [plane.kube() for _ in range(max(args.concurrency, 1))]
        count = args.concurrency * args.rounds
        floor = latencies(clients, lambda k, name: chain_of_writes(k, name, "floor"), count)

        config = identity.write_kubeconfig(plane, Path(tmp) / "operator")
        operator = OperatorProcess(config, Path(tmp) / "operator.log", "--dev").start()
        try:
            wait_for("nodes accounted", lambda: len(kube.list(kinds.GPU_NODE)) == args.nodes, timeout=60)
            ours = latencies(clients, lambda k, name: created(k, name, "ours"), count)
            budgeted = latencies(clients, lambda k, name: created(k, name, "budgeted"), count)
            for ns in ("ours", "budgeted"):
                for vmi in kube.list(kinds.VMI, ns):
                    kube.delete(kinds.VMI, vmi["metadata"]["name"], ns)
            # The burst gets the whole cluster: the collector frees the first phases' units (§6.2).
            wait_for(
                "units freed",
                lambda: not any(kube.list(kinds.GPU_DEVICE, ns) for ns in ("ours", "budgeted")),
                timeout=120,
            )
            burst = [plane.kube() for _ in range(args.burst)]
            outcomes = latencies(burst, lambda k, name: outcome(k, name, "burst"), args.burst)
        finally:
            operator.stop()
    print(f"VMI admission, {args.concurrency} concurrent creates x {args.rounds} rounds, 2 template devices each")
    print(f"{'':<28}{'operator':>13}{'floor':>15}{'ratio':>11}")
    row("p50", statistics.median(ours), statistics.median(floor))
    row("p99", pct(ours, 0.99), pct(floor, 0.99))
    print(f"{'':<28}{'budgeted':>13}{'no budget':>15}{'ratio':>11}")
    row("p50 under a GPUBudget", statistics.median(budgeted), statistics.median(ours))
    row("p99 under a GPUBudget", pct(budgeted, 0.99), pct(ours, 0.99))
    tally = {k: RESULTS.count(k) for k in ("admitted", "refused", "timed out", "error")}
    print(
        f"burst of {args.burst} creates at once: "
        + ", ".join(f"{v} {k}" for k, v in tally.items())
        + f"; slowest {max(outcomes) * 1e3:.0f} ms"
    )


RESULTS: list[str] = []


def created(kube: Kube, name: str, namespace: str) -> None:
    kube.create(kinds.VMI, vmi_body(name, namespace))


def outcome(kube: Kube, name: str, namespace: str) -> None:
    try:
        kube.create(kinds.VMI, vmi_body(name, namespace))
        RESULTS.append("admitted")
    except ApiError as e:
        RESULTS.append("timed out" if "did not answer" in e.message else "refused" if e.status == 403 else "error")


if __name__ == "__main__":
    main()
