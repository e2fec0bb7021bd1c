"""Webhook registration in dev mode: §3's policies, ready only once registered, removed on exit.

In a module of its own: stopping this operator removes the configurations, which
would pull the webhooks from under any other operator running in the same module.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cozygpu.api import kinds
from cozygpu.devcluster import identity
from cozygpu.kube.adapter import ApiError, Kube
from cozygpu.runtime.admission import webhooks
from tests.support.bodies import gpu_device_body
from tests.support.nodes import Gpu, GPUNodeFactory
from tests.support.objects import update
from tests.support.operators import start_admitting_operator, unregister_webhooks

pytestmark = pytest.mark.integration


def test_configurations_follow_section_3_and_go_away_on_exit(
    operator_kubeconfig: Path, kube: Kube, tmp_path: Path
) -> None:
    """Registered before /readyz says ok, with §3's policies; removed when the operator stops."""
    operator = start_admitting_operator(operator_kubeconfig, tmp_path, "--webhook-timeout", "20")
    try:
        assert operator.ready()
        mutating = kube.get(kinds.MUTATING_WEBHOOKS, webhooks.MUTATING_NAME)["webhooks"][0]
        assert mutating["objectSelector"] == {"matchLabels": {"gpu.cozystack.io/device-reference": "true"}}
        assert (mutating["reinvocationPolicy"], mutating["sideEffects"], mutating["failurePolicy"]) == (
            "IfNeeded",
            "NoneOnDryRun",
            "Fail",
        )
        assert mutating["timeoutSeconds"] == 20
        assert mutating["rules"][0]["operations"] == ["CREATE"]
        validating = kube.get(kinds.VALIDATING_WEBHOOKS, "cozy-gpu-operator")["webhooks"]
        assert sorted(w["name"] for w in validating) == [
            "gpubudget.gpu.cozystack.io",
            "gpuclass.gpu.cozystack.io",
            "gpudevice.gpu.cozystack.io",
        ]
        skip_ourselves = f'request.userInfo.username != "{identity.USERNAME}"'
        assert all(
            w["matchConditions"] == [{"name": "not-the-operator", "expression": skip_ourselves}] for w in validating
        )
    finally:
        operator.stop()
    assert kube.get_or_none(kinds.MUTATING_WEBHOOKS, webhooks.MUTATING_NAME) is None
    assert kube.get_or_none(kinds.VALIDATING_WEBHOOKS, "cozy-gpu-operator") is None


def test_the_operator_never_waits_on_its_own_webhook(
    operator_kubeconfig: Path,
    as_operator: Kube,
    kube: Kube,
    namespace: str,
    gpu: Gpu,
    gpu_node: GPUNodeFactory,
    tmp_path: Path,
) -> None:
    """Killed, its configurations point at nothing: others' writes fail closed, its own (finalizers) still land."""
    gpu_node({gpu.resource: 1}, name=f"self-{gpu.cls}")
    operator = start_admitting_operator(operator_kubeconfig, tmp_path)
    try:
        kube.create(kinds.GPU_DEVICE, gpu_device_body("h", namespace, gpu.cls))
        operator.kill()
        with pytest.raises(ApiError, match="failed calling webhook"):
            update(kube, kinds.GPU_DEVICE, "h", lambda b: b["metadata"].update(labels={"who": "admin"}), namespace)
        # As the operator writes a device's metadata: a merge patch under its version.
        protect = ["gpu.cozystack.io/in-use-protection"]
        version = as_operator.get(kinds.GPU_DEVICE, "h", namespace)["metadata"]["resourceVersion"]
        patch = {"metadata": {"resourceVersion": version, "finalizers": protect}}
        body = as_operator.patch(kinds.GPU_DEVICE, "h", patch, namespace)
        assert body["metadata"]["finalizers"] == protect
    finally:
        operator.kill()
        unregister_webhooks(kube)
    kube.patch(kinds.GPU_DEVICE, "h", {"metadata": {"finalizers": None}}, namespace)
