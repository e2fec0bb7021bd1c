"""Benchmark: decisions from the in-memory view, at cluster sizes a GPU cloud has.

Prints figures; asserts nothing (these machines are shared and noisy). Measures the
pure decision paths the binder and the webhook run per request: placing a set,
checking orders against budgets, and computing a GPUNode status, over a view of
N nodes and M devices (every other one a template device owned by a running VMI);
and the collector's safety-net sweep, which judges every device (§6.4). Then a budget
check among many tenants with an org-wide budget, beside the same check by a walk of every
budget and namespace (how it was done before the view indexed budgets), and the ratio.
Run: `make bench` (or `python bench/placement.py --nodes 500`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable

from cozygpu.api import GPUDevice, kinds
from cozygpu.api.names import FINALIZER_IN_USE, LABEL_TEMPLATE_DEVICE
from cozygpu.api.selectors import selector_matches
from cozygpu.decisions.budgets import check_orders
from cozygpu.decisions.lifecycle import device_actions
from cozygpu.decisions.nodestatus import gpunode_status
from cozygpu.decisions.orders import Order
from cozygpu.decisions.placement import place, place_scanning
from cozygpu.runtime.metrics import Metrics
from cozygpu.runtime.view import View
from cozygpu.state.cluster import Cluster

RESOURCES = ["nvidia.com/A10", "nvidia.com/L40S", "nvidia.com/H100"]


def build(nodes: int, devices: int, namespaces: int, seed: int) -> Cluster:
    rng = random.Random(seed)
    c = Cluster()
    view = View(c)
    for i, r in enumerate(RESOURCES):
        view.apply(
            kinds.GPU_CLASS,
            {"metadata": {"name": f"c{i}", "resourceVersion": "1"}, "spec": {"mode": "passthrough", "resourceName": r}},
        )
    # A second class of the first resource: a set may mix the two (a held device of one, a template of the other).
    view.apply(
        kinds.GPU_CLASS,
        {
            "metadata": {"name": "c0b", "resourceVersion": "1"},
            "spec": {"mode": "passthrough", "resourceName": RESOURCES[0]},
        },
    )
    for n in range(nodes):
        r = RESOURCES[n % len(RESOURCES)]
        view.apply(
            kinds.NODE,
            {
                "metadata": {"name": f"node-{n:05d}", "resourceVersion": "1", "labels": {}},
                "spec": {},
                "status": {"allocatable": {r: "8"}, "conditions": [{"type": "Ready", "status": "True"}]},
            },
        )
    for ns in range(namespaces):
        view.apply(kinds.NAMESPACE, {"metadata": {"name": f"t{ns}", "labels": {}}})
        view.apply(
            kinds.GPU_BUDGET,
            {
                "metadata": {"name": "b", "namespace": f"t{ns}", "resourceVersion": "1"},
                "spec": {"limits": {"c0": 10_000}, "total": 100_000},
            },
        )
    for d in range(devices):
        n = rng.randrange(nodes)
        ns = f"t{d % namespaces}"
        meta: dict[str, object] = {"name": f"d{d}", "namespace": ns, "resourceVersion": str(d + 2)}
        status: dict[str, object] = {"phase": "Bound", "nodeName": f"node-{n:05d}"}
        if d % 2:  # a template device of a running VMI: attached, owned, protected
            uid = f"uid-{d}"
            view.apply(kinds.VMI, {"metadata": {"name": f"vm{d}", "namespace": ns, "uid": uid}})
            meta.update(
                name=f"vm{d}-gpu-0",
                labels={LABEL_TEMPLATE_DEVICE: "true"},
                finalizers=[FINALIZER_IN_USE],
                ownerReferences=[
                    {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": f"vm{d}", "uid": uid}
                ],
            )
            status["attachedTo"] = {"vmi": f"vm{d}", "uid": uid}
        view.apply(
            kinds.GPU_DEVICE,
            {"metadata": meta, "spec": {"className": f"c{n % len(RESOURCES)}", "count": 1}, "status": status},
        )
    return c


def timed(label: str, fn: Callable[[], object], rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    p50, p99 = statistics.median(samples), sorted(samples)[int(0.99 * (len(samples) - 1))]
    print(f"{label:<44} p50 {p50 * 1e3:8.3f} ms   p99 {p99 * 1e3:8.3f} ms   ({rounds} rounds)")
    return p50


def _use_by_walk(c: Cluster, namespace: str) -> dict[str, int]:
    """Units in use under every budget covering the namespace, walking every budget and namespace (the peer)."""
    used: dict[str, int] = {}
    for b in c.budgets.values():
        selector = b.spec.namespace_selector
        if b.namespace != namespace and (
            selector is None or not selector_matches(selector, c.namespace_labels(namespace))
        ):
            continue
        covered = {b.namespace or ""}
        if selector is not None:
            covered |= {ns for ns in c.namespaces if selector_matches(selector, c.namespace_labels(ns))}
        for ns in covered:
            for class_name, units in c.budgets.use_in(ns).items():
                used[class_name] = used.get(class_name, 0) + units
    return used


def budgets_among_tenants(tenants: int, rounds: int) -> None:
    """One budget per tenant namespace and one org-wide budget selecting all of them."""
    c = build(100, tenants, tenants, seed=2)
    View(c).apply(
        kinds.GPU_BUDGET,
        {
            "metadata": {"name": "org", "namespace": "t0", "resourceVersion": "1"},
            "spec": {
                "namespaceSelector": {"matchExpressions": [{"key": "org", "operator": "DoesNotExist"}]},
                "total": 10 * tenants,
            },
        },
    )
    orders = [Order("t1", "c0", 1, "deviceTemplate 0"), Order("t1", "c0", 2, "deviceTemplate 1")]
    print(f"budgets among {tenants} tenant namespaces, one org-wide budget:")
    indexed = timed("  check two orders (the view's budget index)", lambda: check_orders(c, orders), rounds)
    walked = timed("  the same use by a walk (the peer)", lambda: [_use_by_walk(c, "t1") for _ in orders], rounds)
    assert check_orders(c, orders) is None and sum(_use_by_walk(c, "t1").values()) > 0
    print(f"  walk / index: {walked / indexed:.0f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--devices", type=int, default=5000)
    p.add_argument("--namespaces", type=int, default=200)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--tenants", type=int, default=0, help="also time a budget check among this many tenants")
    args = p.parse_args()

    tracemalloc.start()
    start = time.perf_counter()
    c = build(args.nodes, args.devices, args.namespaces, seed=1)
    built = time.perf_counter() - start
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(
        f"view: {args.nodes} nodes, {args.devices} devices, {args.namespaces} namespaces "
        f"built in {built:.2f}s, {current / 2**20:.1f} MiB held (peak {peak / 2**20:.1f} MiB)"
    )

    new = [
        GPUDevice.from_wire(
            {"metadata": {"name": f"new{i}", "namespace": "t0"}, "spec": {"className": "c0", "count": 1 + i % 2}}
        )
        for i in range(2)
    ]
    timed("place a set of two new devices", lambda: place(c, new), args.rounds)
    gather = [c.devices[("t0", "d0")], c.devices[("t2", "d2")]]
    timed("place a set gathering two Bound devices", lambda: place(c, gather), args.rounds)
    # A VM start with a held device (Bound) and a new template device of its class (issue 34 item 5), beside the
    # scan over every node with the resource that decided it before.
    held = c.devices[("t0", "d0")]
    template = {"metadata": {"name": "vm-gpu-1", "namespace": "t0"}, "spec": {"className": held.spec.class_name}}
    template["spec"]["count"] = 1
    start = [held, GPUDevice.from_wire(template)]
    assert place(c, start) == place_scanning(c, start)
    fast = timed("place a VM start: a held device + a new one", lambda: place(c, start), args.rounds)
    scan = timed("  the same by a scan of every node (before)", lambda: place_scanning(c, start), args.rounds)
    print(f"  scan / place: {scan / fast:.0f}x")
    of_c0 = next(d for d in c.devices.values() if d.spec.class_name == "c0" and d.holds_gpus)
    mixed = [of_c0, GPUDevice.from_wire({**template, "spec": {"className": "c0b", "count": 1}})]
    assert place(c, mixed) == place_scanning(c, mixed)
    fast = timed("place a VM start mixing two classes", lambda: place(c, mixed), args.rounds)
    scan = timed("  the same by a scan of every node (before)", lambda: place_scanning(c, mixed), args.rounds)
    print(f"  scan / place: {scan / fast:.0f}x")
    orders = [Order("t0", "c0", 1, "deviceTemplate 0"), Order("t0", "c0", 2, "deviceTemplate 1")]
    timed("check two orders against budgets", lambda: check_orders(c, orders), args.rounds)
    now = dt.datetime.now(dt.UTC)
    timed("compute one GPUNode status", lambda: gpunode_status(c, "node-00000", [], now), args.rounds)
    grace = dt.timedelta(minutes=2)
    sweep_rounds = max(3, args.rounds // 40)
    timed(
        "collector sweep: judge every device",
        lambda: [device_actions(c, d, now, grace) for d in c.devices.values()],
        sweep_rounds,
    )
    scrape(c, now, sweep_rounds)
    if args.tenants:
        budgets_among_tenants(args.tenants, max(5, args.rounds // 10))


def scrape(c: Cluster, now: dt.datetime, rounds: int) -> None:
    """A /metrics scrape with every node's GPUNode in the view: what it holds the event loop for (reading the
    figures; the text is written in a thread) beside the whole of it, as served before stop 38."""
    view = View(c)
    for i, name in enumerate(sorted(c.capacity.nodes)):
        status = gpunode_status(c, name, [], now)
        if status is not None:
            body = {"metadata": {"name": name, "resourceVersion": str(10**9 + i)}, "status": status.wire()}
            view.apply(kinds.GPU_NODE, body)
    metrics = Metrics(c)
    size = len(metrics.render()[0])
    label = f"a /metrics scrape ({size / 2**20:.1f} MiB): read on the loop"
    on_loop = timed(label, lambda: list(metrics.registry.collect()), rounds)
    whole = timed("  the whole scrape on the loop (before)", metrics.render, rounds)
    print(f"  whole / on the loop: {whole / on_loop:.1f}x")


if __name__ == "__main__":
    main()
