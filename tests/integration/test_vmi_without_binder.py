"""The VMI webhook with no binder running (§3).

A binder that does not answer in time: the VMI is refused and the call's writes
undone. And a held device whose node is gone before anything marked it Lost: with the
binder off nothing does, so the webhook's own node check is what refuses it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cozygpu.api import kinds
from cozygpu.devcluster.harness import OperatorProcess, wait_for
from cozygpu.kube.adapter import ApiError, Kube
from tests.conftest import Gpu, GPUNodeFactory, start_admitting_operator
from tests.helpers import gpu_device_body, leftovers, stale, vmi_body

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def silent(operator_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """Webhooks on, binder off: no bind request is ever answered."""
    process = start_admitting_operator(
        operator_kubeconfig, Path(tmp_path_factory.mktemp("silent")), "--no-binder", "--bind-timeout", "2"
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


def test_a_held_device_whose_node_is_gone_is_refused(
    silent: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """§3.3: the device is still Bound to a node that no longer exists; the denial names the node."""
    node = gpu_node({gpu.resource: 1}, name=f"going-{gpu.cls}")["metadata"]["name"]
    kube.create(kinds.GPU_DEVICE, gpu_device_body("h", namespace, gpu.cls))
    body = kube.get(kinds.GPU_DEVICE, "h", namespace)
    body["status"] = {"phase": "Bound", "nodeName": node}
    kube.replace_status(kinds.GPU_DEVICE, body)
    kube.delete(kinds.NODE, node)

    def denial() -> str:
        try:
            kube.create(kinds.VMI, vmi_body("probe", namespace, [{"device": "h"}]), dry_run=True)
        except ApiError as e:
            return e.message
        return ""

    wait_for("the view without the node", lambda: "is gone" in denial())
    with pytest.raises(ApiError) as raised:
        kube.create(kinds.VMI, vmi_body("vm", namespace, [{"device": "h"}]))
    assert raised.value.status == 403
    assert f"GPUDevice h: node {node} is gone" in raised.value.message
    assert leftovers(kube, namespace, "vm") == []
    assert stale(kube, namespace) == []
    assert kube.get(kinds.GPU_DEVICE, "h", namespace)["status"]["phase"] == "Bound"
