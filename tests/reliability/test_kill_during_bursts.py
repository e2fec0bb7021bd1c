"""kill -9 at random moments during bursts of concurrent admissions (issue 12 item 4), seeded.

Each run starts the operator, checks that what the previous kill left is cleared, sends a burst
of VMI creates that contend for the same held devices, the same nodes and one budget, and kills
the operator at a random moment of it. The seed is printed and recorded: a failure replays with
COZYGPU_SEED.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cozygpu.api import kinds
from cozygpu.api.names import API_VERSION
from cozygpu.kube.adapter import ApiError, Kube
from tests.support.bodies import gpu_device_body, vmi_body
from tests.support.invariants import admitting, settled
from tests.support.nodes import Gpu, GPUNodeFactory
from tests.support.operators import start_admitting_operator
from tests.support.soak import TALLY, Budget, runs

QUICK = ("--grace-period", "1", "--sweep-interval", "1", "--bind-timeout", "4")
BURST = 8
HELD = 3


def _refs(rng: random.Random, cls: str) -> list[dict[str, Any]]:
    """One to four entries: held devices several VMIs of a burst want at once, and templates."""
    refs: list[dict[str, Any]] = [
        {"device": name} for name in rng.sample([f"held-{i}" for i in range(HELD)], rng.randint(0, 2))
    ]
    for _ in range(rng.randint(0 if refs else 1, 2)):
        refs.append({"deviceTemplate": {"className": cls, "count": rng.randint(1, 2)}})
    return refs


@pytest.mark.timeout(0)
def test_kill_9_at_random_moments_of_bursts_leaves_nothing_broken(
    operator_kubeconfig: Path, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory, tmp_path: Path
) -> None:
    """Over seeded runs: a burst of concurrent creates, the operator killed (SIGKILL) in the middle of it, started
    again; every invariant holds once a grace period and a sweep have passed, and the operator is ready."""
    seed = int(os.environ.get("COZYGPU_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    record = TALLY["kill -9 during bursts"]
    record.note = f"seed {seed}"
    for n in range(2):
        gpu_node({gpu.resource: 4}, name=f"burst-{n}-{gpu.cls}")
    for i in range(HELD):
        kube.create(kinds.GPU_DEVICE, gpu_device_body(f"held-{i}", namespace, gpu.cls))
    # Fewer units than the nodes have: the budget, not capacity, refuses some orders.
    kube.create(
        kinds.GPU_BUDGET,
        {
            "apiVersion": API_VERSION,
            "kind": "GPUBudget",
            "metadata": {"name": "cap", "namespace": namespace},
            "spec": {"limits": {gpu.cls: 6}},
        },
    )
    budget = Budget("kill -9 during bursts")
    total = runs(3, 1000)
    n, hits, in_flight = 0, 0, 0
    while n < total and budget.left():
        n += 1
        directory = tmp_path / f"run-{n}"
        directory.mkdir()
        operator = start_admitting_operator(operator_kubeconfig, directory, *QUICK)
        try:
            settled(kube, namespace, operator, record, f"run {n} (seed {seed}), before its burst")
            for vmi in kube.list(kinds.VMI, namespace):  # the previous burst's VMIs go: their units come back
                kube.delete(kinds.VMI, vmi["metadata"]["name"], namespace)
            settled(kube, namespace, operator, record, f"run {n} (seed {seed}), the previous VMIs deleted")
            threads = [
                threading.Thread(target=_create, args=(kube, namespace, f"vm{n}-{i}", _refs(rng, gpu.cls)))
                for i in range(BURST)
            ]
            for t in threads:
                t.start()
            # From the first admission under way, a random moment of the burst's (which often ends within 0.3 s).
            admitting(kube, namespace, f"vm{n}-")
            time.sleep(rng.uniform(0.0, 0.15))
            in_flight = sum(t.is_alive() for t in threads)
        finally:
            operator.kill()
        for t in threads:
            t.join(timeout=60)
        record.runs += 1
        hits += in_flight > 0
    record.note = f"seed {seed}; {hits} of {record.runs} kills with creates in flight"
    (tmp_path / "final").mkdir()
    final = start_admitting_operator(operator_kubeconfig, tmp_path / "final", *QUICK)
    try:
        settled(kube, namespace, final, record, f"after the last run (seed {seed})")
    finally:
        final.stop()
    assert record.violations == [], f"seed {seed}: " + "; ".join(record.violations)
    assert hits > 0, f"seed {seed}: no kill landed while a create was in flight"


def _create(kube: Kube, namespace: str, name: str, refs: list[dict[str, Any]]) -> None:
    with contextlib.suppress(ApiError):  # refused, or the webhook gone with the operator: fail closed
        kube.create(kinds.VMI, vmi_body(name, namespace, refs))
