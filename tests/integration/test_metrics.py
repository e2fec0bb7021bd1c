"""§10 metrics from the running operator: a real admission, bind and refusal show up in /metrics."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cozygpu.api import kinds
from cozygpu.api.names import API_VERSION
from cozygpu.kube.adapter import ApiError, Kube
from tests.support.bodies import gpu_device_body, vmi_body
from tests.support.harness import OperatorProcess, wait_for
from tests.support.nodes import Gpu, GPUNodeFactory

pytestmark = pytest.mark.integration


def scrape(operator: OperatorProcess, token: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    answer = operator.metrics(token)
    assert answer.status_code == 200, answer.text
    text = answer.text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(operator: OperatorProcess, token: str, name: str, **labels: str) -> float:
    return scrape(operator, token).get((name, frozenset(labels.items())), 0.0)


def test_admissions_binds_devices_nodes_and_budgets_are_measured(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory, metrics_token: str
) -> None:
    """After one held device, one admitted VMI and one refused: each figure says so, with its labels."""

    def seen(name: str, **labels: str) -> float:
        return sample(admitting, metrics_token, name, **labels)

    node = gpu_node({gpu.resource: 4}, name=f"m-{gpu.cls}")["metadata"]["name"]
    kube.create(
        kinds.GPU_BUDGET,
        {
            "apiVersion": API_VERSION,
            "kind": "GPUBudget",
            "metadata": {"name": "cap", "namespace": namespace},
            "spec": {"limits": {gpu.cls: 3}},
        },
    )
    kube.create(kinds.GPU_DEVICE, gpu_device_body("h", namespace, gpu.cls))
    wait_for("h bound", lambda: kube.get(kinds.GPU_DEVICE, "h", namespace).get("status", {}).get("phase") == "Bound")
    kube.create(kinds.VMI, vmi_body("vm", namespace, [{"device": "h"}]))
    with pytest.raises(ApiError):
        kube.create(kinds.VMI, vmi_body("other", namespace, [{"device": "h"}]))

    assert seen("cozygpu_admission_duration_seconds_count", webhook="vmi", result="allowed") >= 1
    assert seen("cozygpu_admission_duration_seconds_count", webhook="vmi", result="denied") >= 1
    assert (
        sample(
            admitting, metrics_token, "cozygpu_admission_duration_seconds_count", webhook="gpudevice", result="allowed"
        )
        >= 1
    )
    assert seen("cozygpu_bind_duration_seconds_count", result="Succeeded") >= 1
    assert seen("cozygpu_devices", **{"class": gpu.cls, "phase": "Bound"}) == 1
    wait_for("node units", lambda: seen("cozygpu_node_units", node=node, resource=gpu.resource, state="held") == 1)
    assert seen("cozygpu_node_units", node=node, resource=gpu.resource, state="free") == 3
    budget = {"namespace": namespace, "budget": "cap", "class": gpu.cls}
    wait_for("budget use", lambda: seen("cozygpu_budget_used_units", **budget) == 1)
    assert seen("cozygpu_budget_limit_units", **budget) == 3
    kube.delete(kinds.VMI, "vm", namespace)
