"""Webhook registration in dev mode: §3's policies, ready only once registered, removed on exit.

In a module of its own: stopping this operator removes the configurations, which
would pull the webhooks from under any other operator running in the same module.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cozygpu.kube import kinds
from cozygpu.kube.adapter import Kube
from tests.conftest import start_admitting_operator

pytestmark = pytest.mark.integration


def test_configurations_follow_section_3_and_go_away_on_exit(
    operator_kubeconfig: Path, kube: Kube, tmp_path: Path
) -> None:
    """Registered before /readyz says ok, with §3's policies; removed when the operator stops."""
    operator = start_admitting_operator(operator_kubeconfig, tmp_path, "--webhook-timeout", "20")
    try:
        assert operator.ready()
        mutating = kube.get(kinds.MUTATING_WEBHOOKS, "cozy-gpu-operator")["webhooks"][0]
        assert mutating["objectSelector"] == {"matchLabels": {"gpu.cozystack.io/device-reference": "true"}}
        assert (mutating["reinvocationPolicy"], mutating["sideEffects"], mutating["failurePolicy"]) == (
            "IfNeeded", "NoneOnDryRun", "Fail")  # fmt: skip
        assert mutating["timeoutSeconds"] == 20
        assert mutating["rules"][0]["operations"] == ["CREATE"]
        validating = kube.get(kinds.VALIDATING_WEBHOOKS, "cozy-gpu-operator")["webhooks"]
        assert sorted(w["name"] for w in validating) == [
            "gpubudget.gpu.cozystack.io", "gpuclass.gpu.cozystack.io", "gpudevice.gpu.cozystack.io"]  # fmt: skip
    finally:
        operator.stop()
    assert kube.get_or_none(kinds.MUTATING_WEBHOOKS, "cozy-gpu-operator") is None
    assert kube.get_or_none(kinds.VALIDATING_WEBHOOKS, "cozy-gpu-operator") is None
