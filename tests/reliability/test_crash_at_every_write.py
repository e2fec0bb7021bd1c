"""Crash at every write (issue 12): the operator exits right after its Nth API write lands, for every N over an
admission and what follows it; restarted, it leaves no invariant broken."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from cozygpu.api import kinds
from cozygpu.devcluster.harness import OperatorProcess, wait_for
from cozygpu.kube.adapter import ApiError, Kube
from cozygpu.runtime.writes import CRASHED
from tests.conftest import Gpu, GPUNodeFactory, start_admitting_operator
from tests.helpers import gpu_device_body, vmi_body
from tests.reliability.invariants import violations

QUICK = ("--grace-period", "2", "--sweep-interval", "2", "--bind-timeout", "5")
# Writes an admission of a held and a template device causes, with the collector's and accountant's after it,
# are well under this; the scenario ends at the first N the operator outlives.
MAX_WRITES = 40


@pytest.mark.timeout(900)
def test_a_crash_after_any_write_of_an_admission_leaves_nothing_broken(
    operator_kubeconfig: Path, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory, tmp_path: Path
) -> None:
    """For N = 1, 2, ...: a VMI with a held and a template device is created while the operator is set to exit
    after its Nth write; the operator is started again; the invariants hold once a grace period and a sweep
    have passed (the VMI is then deleted and everything released before the next N)."""
    gpu_node({gpu.resource: 2})
    kube.create(kinds.GPU_DEVICE, gpu_device_body("held", namespace, gpu.cls))
    outlived = None
    for n in range(1, MAX_WRITES + 1):
        (tmp_path / f"crash-{n}").mkdir()
        (tmp_path / f"after-{n}").mkdir()
        crashing = OperatorProcess(operator_kubeconfig, tmp_path / f"crash-{n}" / "operator.log", "--dev", *QUICK,
                                   "--crash-at-write", str(n))  # fmt: skip
        try:
            crashing.start()
        except RuntimeError:  # the Nth write came before it was ready (a GPUNode status, say)
            assert crashing.proc is not None and crashing.proc.poll() == CRASHED, crashing.tail()
        refs = [{"device": "held"}, {"deviceTemplate": {"className": gpu.cls, "count": 1}}]
        with contextlib.suppress(ApiError):  # a crash inside the admission (or before): the API server fails closed
            kube.create(kinds.VMI, vmi_body(f"vm{n}", namespace, refs))
        try:
            wait_for("the injected crash", lambda p=crashing: p.proc is not None and p.proc.poll() is not None,
                     timeout=8)  # fmt: skip
        except AssertionError:
            crashing.stop()
            outlived = n
            break
        assert crashing.proc is not None and crashing.proc.returncode == CRASHED, crashing.tail()
        after = start_admitting_operator(operator_kubeconfig, tmp_path / f"after-{n}", *QUICK)
        try:
            wait_for(f"no violation after a crash at write {n}", lambda: not violations(kube, namespace), timeout=30)
            if kube.get_or_none(kinds.VMI, f"vm{n}", namespace) is not None:
                kube.delete(kinds.VMI, f"vm{n}", namespace)
            wait_for(f"everything of vm{n} released", lambda: not violations(kube, namespace), timeout=30)
        finally:
            after.stop()
    assert outlived is not None, f"the operator still crashed at write {MAX_WRITES}"
    assert outlived > 3, "the admission made fewer writes than it should: the crash hook missed some"
