"""One namespace's share of the VMI admissions under way at once (§14.3), through the real API server.

The operator runs without its binder, so every admission stays under way for its bind
timeout: what one tenant has under way is what it holds of the operator's API calls.
"""

from __future__ import annotations

import concurrent.futures
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cozygpu.api import kinds
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.devcluster.harness import OperatorProcess, wait_for
from cozygpu.kube.adapter import ApiError, Kube
from tests.conftest import Gpu, GPUNodeFactory, start_admitting_operator, unregister_webhooks
from tests.helpers import vmi_body

pytestmark = pytest.mark.integration


@pytest.fixture
def waiting_operator(
    operator_kubeconfig: Path, control_plane: ControlPlane, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """Webhooks with no binder, so every admission stays under way for its bind timeout; two per namespace."""
    process = start_admitting_operator(operator_kubeconfig, tmp_path, "--no-binder", "--bind-timeout", "4",
                                       "--max-admissions-per-namespace", "2")  # fmt: skip
    yield process
    process.stop()
    unregister_webhooks(control_plane.kube())


def test_one_namespace_cannot_hold_more_than_its_share_of_admissions(
    waiting_operator: OperatorProcess, kube: Kube, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """§14.3: with two admissions under way in a namespace, a third there is refused at once naming the limit,
    while another namespace's admission is still taken up; once the two end, the namespace admits again."""
    gpu_node({gpu.resource: 8}, name=f"share-{gpu.cls}")
    a, b = (f"{t}-{uuid.uuid4().hex[:6]}" for t in ("share-a", "share-b"))
    for ns in (a, b):
        kube.create(kinds.NAMESPACE, {"metadata": {"name": ns}})
    refs = [{"deviceTemplate": {"className": gpu.cls, "count": 1}}]

    def create(name: str, namespace: str) -> str:
        try:
            kube.create(kinds.VMI, vmi_body(name, namespace, refs))
        except ApiError as e:
            return e.message
        return "admitted"

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        first = [pool.submit(create, f"v{i}", a) for i in range(2)]
        wait_for("two admissions under way", lambda: all(
            (kube.get_or_none(kinds.GPU_DEVICE, f"v{i}-gpu-0", a) or {}).get("status", {}).get("bindRequest")
            for i in range(2)), timeout=10)  # fmt: skip
        third = create("v2", a)
        other = pool.submit(create, "w0", b)
        assert f"namespace {a} has 2 VMI admissions with GPUs under way" in third
        answers = [f.result(timeout=30) for f in first] + [other.result(timeout=30)]
    assert all("did not answer within 4s" in m for m in answers), answers
    assert "under way" not in create("v3", a)
