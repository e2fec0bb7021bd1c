"""A binder that does not answer in time (§3): the VMI is refused and the call's writes undone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.devcluster.harness import OperatorProcess
from cozygpu.kube import kinds
from cozygpu.kube.adapter import ApiError, Kube
from tests.conftest import Gpu, GPUNodeFactory, start_admitting_operator
from tests.helpers import gpu_device_body, leftovers, vmi_body

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def silent(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """Webhooks on, binder off: no bind request is ever answered."""
    process = start_admitting_operator(
        control_plane, Path(tmp_path_factory.mktemp("silent")), "--no-binder", "--bind-timeout", "2"
    )
    yield process
    process.stop()


def test_no_answer_within_the_bind_timeout_is_a_refusal_that_cleans_up(
    silent: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """The tenant reads that the binder did not answer and that KubeVirt retries; nothing is left."""
    gpu_node({gpu.resource: 2}, name=f"quiet-{gpu.cls}")
    # A held device the test places itself, as the binder would have (the binder is off here).
    kube.create(kinds.GPU_DEVICE, gpu_device_body("h", namespace, gpu.cls))
    body = kube.get(kinds.GPU_DEVICE, "h", namespace)
    body["status"] = {"phase": "Bound", "nodeName": f"quiet-{gpu.cls}"}
    kube.replace_status(kinds.GPU_DEVICE, body)
    refs = [{"device": "h"}, {"deviceTemplate": {"className": gpu.cls, "count": 1}}]
    with pytest.raises(ApiError) as raised:
        kube.create(kinds.VMI, vmi_body("vm", namespace, refs))
    assert "the GPU binder did not answer within 2s; KubeVirt retries the start" in raised.value.message
    assert leftovers(kube, namespace, "vm") == []
    status = kube.get(kinds.GPU_DEVICE, "h", namespace)["status"]
    assert (status["phase"], status["nodeName"]) == ("Bound", f"quiet-{gpu.cls}")
    assert "attachedTo" not in status
    assert "bindRequest" not in status
    assert [e["reason"] for e in silent.events("vmi.refused")][-1].startswith("the GPU binder did not answer")
