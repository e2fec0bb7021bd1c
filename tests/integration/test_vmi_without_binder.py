"""The VMI webhook with no binder running (§3).

A binder that does not answer in time: the VMI is refused and the call's writes
undone, but never what a concurrent admission of the same VMI name took over (the test
answers that one itself, as the binder would). And a held device whose node is gone
before anything marked it Lost: with the binder off nothing does, so the webhook's own
node check is what refuses it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cozygpu.api import kinds
from cozygpu.api.names import template_device_name
from cozygpu.kube.adapter import ApiError, Kube
from tests.support.bodies import gpu_device_body, vmi_body
from tests.support.harness import OperatorProcess, wait_for
from tests.support.invariants import stale
from tests.support.nodes import Gpu, GPUNodeFactory
from tests.support.operators import start_admitting_operator
from tests.support.refusals import leftovers

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def silent(operator_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """Webhooks on, binder off: no bind request is ever answered. 8 s: the race below takes its steps within
    the first call's wait, on a busy machine too."""
    process = start_admitting_operator(
        operator_kubeconfig, Path(tmp_path_factory.mktemp("silent")), "--no-binder", "--bind-timeout", "8"
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
    assert "the GPU binder did not answer within 8s; KubeVirt retries the start" in raised.value.message
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


def test_a_refused_create_leaves_the_template_device_a_concurrent_create_of_the_same_name_took_over(
    silent: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """Issue 12 item 7: the first call made the template device, the second reused it and was answered; the
    first call's undo after its timeout must not delete the device the admitted VMI now runs with."""
    node = gpu_node({gpu.resource: 1}, name=f"race-{gpu.cls}")["metadata"]["name"]
    refs = [{"deviceTemplate": {"className": gpu.cls, "count": 1}}]
    device = template_device_name("vm", 0)
    outcomes: dict[str, Any] = {}

    def create(who: str) -> None:
        try:
            outcomes[who] = kube.create(kinds.VMI, vmi_body("vm", namespace, refs))
        except ApiError as e:
            outcomes[who] = e

    def request_id() -> str | None:
        body = kube.get_or_none(kinds.GPU_DEVICE, device, namespace)
        return ((body or {}).get("status", {}).get("bindRequest") or {}).get("id")

    first = threading.Thread(target=create, args=("first",))
    first.start()
    wait_for("the first call's request", lambda: request_id() is not None)
    first_request = request_id()
    second = threading.Thread(target=create, args=("second",))
    second.start()
    wait_for("the second call's request", lambda: request_id() not in (None, first_request))

    answer = kube.get(kinds.GPU_DEVICE, device, namespace)  # the binder's answer to the second call
    answer["status"].update({"phase": "Bound", "nodeName": node})
    answer["status"]["bindRequest"]["result"] = "Succeeded"
    kube.replace_status(kinds.GPU_DEVICE, answer)
    second.join(timeout=30)
    first.join(timeout=30)
    assert isinstance(outcomes["second"], dict), outcomes["second"]
    assert isinstance(outcomes["first"], ApiError)
    assert "did not answer within 8s" in outcomes["first"].message
    kept = kube.get(kinds.GPU_DEVICE, device, namespace)
    assert "deletionTimestamp" not in kept["metadata"]
    assert kept["status"]["attachedTo"]["vmi"] == "vm"
    assert (kept["status"]["phase"], kept["status"]["nodeName"]) == ("Bound", node)
    assert [e["device"] for e in silent.events("vmi.undo.left")] == [device]
