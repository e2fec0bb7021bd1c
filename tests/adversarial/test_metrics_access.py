"""Issue 19 item 5 (§14.4, §14.3): /metrics names every tenant's namespaces, budgets and use per node.

The attacker is any pod that reaches the operator's metrics port, or a tenant with its own
ServiceAccount token: neither reads the metrics without the chart's metrics-reader role, and a
flood of made-up tokens neither reads them nor holds up another tenant's admission.
"""

from __future__ import annotations

import concurrent.futures
import uuid

import pytest

from cozygpu.api import kinds
from cozygpu.devcluster.bodies import vmi_body
from cozygpu.kube.adapter import Kube
from tests.support.harness import OperatorProcess
from tests.support.invariants import assert_invariants
from tests.support.nodes import Gpu, GPUNodeFactory
from tests.support.tenants import Tenant

pytestmark = [pytest.mark.integration, pytest.mark.adversarial]


def test_metrics_are_served_only_to_callers_allowed_to_get_them(
    admitting: OperatorProcess, kube: Kube, mallory: Tenant, victim: Tenant, metrics_token: str
) -> None:
    """§14.4: no token or a made-up one is 401; mallory's own valid ServiceAccount token, which holds the tenant
    roles but not metrics-reader, is 403; the scraper bound to the chart's metrics-reader role reads them.
    /healthz and /readyz stay open (probes)."""
    assert admitting.metrics(None).status_code == 401
    assert admitting.metrics("not-a-token").status_code == 401
    nosy = admitting.metrics(mallory.token)
    assert nosy.status_code == 403 and f"{mallory.user} may not get /metrics" in nosy.text
    allowed = admitting.metrics(metrics_token)
    assert allowed.status_code == 200 and "# TYPE cozygpu_devices gauge" in allowed.text
    assert "cozygpu_" not in nosy.text + admitting.metrics(None).text
    assert admitting.ready() and admitting.healthy()
    assert_invariants(kube, (mallory, victim), admitting)


def test_a_flood_of_made_up_tokens_costs_two_checks_at_a_time_and_admissions_go_on(
    admitting: OperatorProcess,
    kube: Kube,
    mallory: Tenant,
    victim: Tenant,
    gpu: Gpu,
    gpu_node: GPUNodeFactory,
    metrics_token: str,
) -> None:
    """§14.3, §14.4: 60 scrapes at once with made-up tokens are each answered 401, or 503 while two checks are
    already under way (the API client pool is the admissions' and the binder's); the victim's VMI is admitted
    meanwhile."""
    gpu_node({gpu.resource: 1}, name=f"flood-{gpu.cls}")
    with concurrent.futures.ThreadPoolExecutor(30) as pool:
        flood = [pool.submit(admitting.metrics, f"made-up-{uuid.uuid4().hex}") for _ in range(60)]
        refs = [{"deviceTemplate": {"className": gpu.cls, "count": 1}}]
        admitted = victim.kube.create(kinds.VMI, vmi_body("meanwhile", victim.namespace, refs))
        codes = [f.result(timeout=60).status_code for f in flood]
    assert set(codes) <= {401, 503} and 503 in codes, codes
    assert admitted["spec"]["domain"]["devices"]["gpus"] == [{"name": "gpudev0-0", "deviceName": gpu.resource}]
    assert admitting.metrics(metrics_token).status_code == 200
    assert_invariants(kube, (mallory, victim), admitting)
