"""Issue 19 item 6 (§14.3): one tenant's share of the VMI admissions under way at once.

The operator runs without its binder, so every admission stays under way for its bind
timeout: what mallory has under way is what she holds of the operator's API calls, and the
victim's admission must still be taken up.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path

import pytest

from cozygpu.api import kinds
from cozygpu.devcluster.bodies import vmi_body
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import ApiError, Kube
from tests.support.harness import OperatorProcess, wait_for
from tests.support.invariants import assert_invariants
from tests.support.nodes import Gpu, GPUNodeFactory
from tests.support.operators import start_admitting_operator, unregister_webhooks
from tests.support.tenants import Tenant

pytestmark = [pytest.mark.integration, pytest.mark.adversarial]


@pytest.fixture
def waiting_operator(
    operator_kubeconfig: Path, control_plane: ControlPlane, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """Webhooks with no binder, so every admission stays under way for its bind timeout; two per namespace."""
    process = start_admitting_operator(
        operator_kubeconfig, tmp_path, "--no-binder", "--bind-timeout", "4", "--max-admissions-per-namespace", "2"
    )
    yield process
    process.stop()
    unregister_webhooks(control_plane.kube())


def test_one_namespace_cannot_hold_more_than_its_share_of_admissions(
    waiting_operator: OperatorProcess, kube: Kube, mallory: Tenant, victim: Tenant, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """§14.3: with two of mallory's admissions under way, a third of hers is refused at once naming the limit,
    while the victim's admission is still taken up; once her two end, her namespace admits again."""
    gpu_node({gpu.resource: 8}, name=f"share-{gpu.cls}")
    a = mallory.namespace
    refs = [{"deviceTemplate": {"className": gpu.cls, "count": 1}}]

    def create(tenant: Tenant, name: str) -> str:
        try:
            tenant.kube.create(kinds.VMI, vmi_body(name, tenant.namespace, refs))
        except ApiError as e:
            return e.message
        return "admitted"

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        first = [pool.submit(create, mallory, f"v{i}") for i in range(2)]
        wait_for(
            "two admissions under way",
            lambda: all(
                (kube.get_or_none(kinds.GPU_DEVICE, f"v{i}-gpu-0", a) or {}).get("status", {}).get("bindRequest")
                for i in range(2)
            ),
            timeout=10,
        )
        third = create(mallory, "v2")
        other = pool.submit(create, victim, "w0")
        assert f"namespace {a} has 2 VMI admissions with GPUs under way" in third
        answers = [f.result(timeout=30) for f in first] + [other.result(timeout=30)]
    assert all("did not answer within 4s" in m for m in answers), answers
    assert "under way" not in create(mallory, "v3")
    assert_invariants(kube, (mallory, victim), waiting_operator)
