"""Crash at every write (issue 12 item 4): the operator exits right after its Nth API write lands, for every N
over a scenario's admissions and what follows them; restarted, it leaves no invariant broken.

Scenarios: a held and a template device admitted; a set the binder refuses, so the call
undoes what it wrote; a held device gathered onto the node of the set; two VMIs admitted at
once under a budget that has room for one; two creates of the same VMI name at once.
`make soak` sweeps every scenario again and again (COZYGPU_SOAK_SWEEPS).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cozygpu.api import kinds
from cozygpu.api.names import API_VERSION
from cozygpu.kube.adapter import ApiError, Kube
from cozygpu.runtime.writes import CRASHED
from tests.support.bodies import gpu_device_body, vmi_body
from tests.support.harness import OperatorProcess, wait_for
from tests.support.invariants import settled
from tests.support.nodes import Gpu, GPUNodeFactory
from tests.support.operators import start_admitting_operator
from tests.support.soak import SOAK, TALLY, Budget, Record

QUICK = ("--grace-period", "1", "--sweep-interval", "1", "--bind-timeout", "5")
# Writes a scenario's admissions cause, with the collector's and accountant's after them, are well under
# this; a sweep ends at the first N the operator outlives.
MAX_WRITES = 60
SWEEPS = int(os.environ.get("COZYGPU_SOAK_SWEEPS", "60")) if SOAK else 1


@dataclass
class Scenario:
    name: str
    nodes: list[int]  # units per node
    held: int  # held devices, each bound (in order) before any admission
    vmis: Callable[[str], list[list[dict[str, Any]]]]  # the class -> each VMI's references, created at once
    budget: int | None = None  # units the namespace's budget allows; None: all the nodes have
    same_name: bool = False  # every VMI of the scenario under one name


SCENARIOS = [
    Scenario(
        "held and template",
        [2],
        1,
        lambda cls: [[{"device": "held-0"}, {"deviceTemplate": {"className": cls, "count": 1}}]],
    ),
    # Three units on one node: no node has them, so the binder refuses and the call undoes its writes.
    Scenario(
        "refused, undone",
        [2, 2],
        1,
        lambda cls: [[{"device": "held-0"}, {"deviceTemplate": {"className": cls, "count": 2}}]],
    ),
    # held-0 fills the one-unit node, held-1 goes to the other: the set of both is gathered there.
    Scenario("gathered", [1, 2], 2, lambda cls: [[{"device": "held-0"}, {"device": "held-1"}]]),
    # Room in the budget for one: the other is refused, whichever order the two are decided in.
    Scenario(
        "two admissions at once under a budget",
        [2, 2],
        0,
        lambda cls: [[{"deviceTemplate": {"className": cls, "count": 1}}]] * 2,
        budget=1,
    ),
    # One name: one create is stored, the other's undo must leave what the winner runs with (item 7).
    Scenario(
        "one VMI name created twice at once",
        [2],
        0,
        lambda cls: [[{"deviceTemplate": {"className": cls, "count": 1}}]] * 2,
        same_name=True,
    ),
]


@pytest.mark.timeout(0)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_a_crash_after_any_write_leaves_nothing_broken(
    scenario: Scenario,
    operator_kubeconfig: Path,
    kube: Kube,
    namespace: str,
    gpu: Gpu,
    gpu_node: GPUNodeFactory,
    tmp_path: Path,
) -> None:
    """For N = 1, 2, ...: the scenario's VMIs are created while the operator is set to exit after its Nth write;
    the operator is started again; every invariant holds once a grace period and a sweep have passed (the VMIs
    are then deleted and everything released before the next N)."""
    record = TALLY[f"crash at every write: {scenario.name}"]
    for i, units in enumerate(scenario.nodes):
        gpu_node({gpu.resource: units}, name=f"crash-{i}-{gpu.cls}")
    kube.create(
        kinds.GPU_BUDGET,
        {
            "apiVersion": API_VERSION,
            "kind": "GPUBudget",
            "metadata": {"name": "cap", "namespace": namespace},
            "spec": {"limits": {gpu.cls: scenario.budget or sum(scenario.nodes)}},
        },
    )
    binder = start_admitting_operator(operator_kubeconfig, _dir(tmp_path, "held"), *QUICK)
    try:
        _hold(scenario, kube, namespace, gpu)
    finally:
        binder.stop()
    budget = Budget(record_name := f"crash at every write: {scenario.name}")
    sweeps, outlived = 0, []
    while sweeps < SWEEPS and budget.left():
        sweeps += 1
        outlived.append(_sweep(scenario, sweeps, operator_kubeconfig, kube, namespace, gpu, tmp_path, record_name))
    assert record.violations == [], "; ".join(record.violations)
    assert all(n > 3 for n in outlived), f"fewer writes than there should be: outlived at {outlived}"


def _sweep(
    scenario: Scenario,
    sweep: int,
    kubeconfig: Path,
    kube: Kube,
    namespace: str,
    gpu: Gpu,
    tmp_path: Path,
    record_name: str,
) -> int:
    """One pass over N = 1, 2, ... until the operator outlives its Nth write; returns that N."""
    record = TALLY[record_name]
    for n in range(1, MAX_WRITES + 1):
        crashing = OperatorProcess(
            kubeconfig,
            _dir(tmp_path, f"crash-{sweep}-{n}") / "operator.log",
            "--dev",
            *QUICK,
            "--crash-at-write",
            str(n),
        )
        try:
            crashing.start()
        except RuntimeError:  # the Nth write came before it was ready (a GPUNode status, say)
            assert crashing.proc is not None and crashing.proc.poll() == CRASHED, crashing.tail()
        names = [f"vm{sweep}-{n}-{0 if scenario.same_name else i}" for i in range(len(scenario.vmis(gpu.cls)))]
        threads = [
            threading.Thread(target=_create, args=(kube, namespace, name, refs))
            for name, refs in zip(names, scenario.vmis(gpu.cls), strict=True)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        try:
            wait_for(
                "the injected crash", lambda p=crashing: p.proc is not None and p.proc.poll() is not None, timeout=8
            )
        except AssertionError:  # it outlived the scenario; still armed, so another clears up for the next sweep
            crashing.stop()
            after = start_admitting_operator(kubeconfig, _dir(tmp_path, f"after-{sweep}-{n}"), *QUICK)
            try:
                _clear(kube, namespace, names, after, record, f"{scenario.name}: outlived at {n} (sweep {sweep})")
                _hold(scenario, kube, namespace, gpu)
            finally:
                after.stop()
            return n
        assert crashing.proc is not None and crashing.proc.returncode == CRASHED, crashing.tail()
        record.runs += 1
        after = start_admitting_operator(kubeconfig, _dir(tmp_path, f"after-{sweep}-{n}"), *QUICK)
        try:
            _clear(kube, namespace, names, after, record, f"{scenario.name}: a crash at write {n} (sweep {sweep})")
            _hold(scenario, kube, namespace, gpu)  # each N starts where the first did (a gather moved one)
        finally:
            after.stop()
    raise AssertionError(f"the operator still crashed at write {MAX_WRITES}")


def _clear(kube: Kube, namespace: str, names: list[str], operator: OperatorProcess, record: Record, when: str) -> None:
    """The invariants, then the run's VMIs deleted and the invariants again (everything of theirs released)."""
    settled(kube, namespace, operator, record, when)
    for name in sorted(set(names)):
        if kube.get_or_none(kinds.VMI, name, namespace) is not None:
            kube.delete(kinds.VMI, name, namespace)
    settled(kube, namespace, operator, record, f"{when}, its VMIs deleted")


def _hold(scenario: Scenario, kube: Kube, namespace: str, gpu: Gpu) -> None:
    """The scenario's held devices made anew, one at a time, each Bound before the next (best fit puts them
    where the scenario says)."""
    for h in range(scenario.held):
        if kube.get_or_none(kinds.GPU_DEVICE, f"held-{h}", namespace) is not None:
            kube.delete(kinds.GPU_DEVICE, f"held-{h}", namespace)
            wait_for(f"held-{h} gone", lambda h=h: kube.get_or_none(kinds.GPU_DEVICE, f"held-{h}", namespace) is None)
    for h in range(scenario.held):
        kube.create(kinds.GPU_DEVICE, gpu_device_body(f"held-{h}", namespace, gpu.cls))
        wait_for(
            f"held-{h} Bound",
            lambda h=h: (
                (kube.get(kinds.GPU_DEVICE, f"held-{h}", namespace).get("status") or {}).get("phase") == "Bound"
            ),
        )


def _create(kube: Kube, namespace: str, name: str, refs: list[dict[str, Any]]) -> None:
    with contextlib.suppress(ApiError):  # a crash inside the admission (or before): the API server fails closed
        kube.create(kinds.VMI, vmi_body(name, namespace, refs))


def _dir(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.mkdir()
    return path
