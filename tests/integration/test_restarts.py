"""The bind protocol survives the operator's restarts (§4): answers are found in the API objects."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import requests

from cozygpu.api import kinds
from cozygpu.kube.adapter import Kube
from tests.support.bodies import gpu_class_body
from tests.support.harness import OperatorProcess, answer_of, logged, template_device, wait_for, write_request
from tests.support.nodes import Gpu, GPUNodeFactory

pytestmark = pytest.mark.integration


def test_a_request_written_while_the_binder_is_down_is_answered_after_restart(
    operator_kubeconfig: Path, kube: Kube, namespace: str, gpu_node: GPUNodeFactory, tmp_path: Path
) -> None:
    """Kill the operator, write a request, start it again: the request is answered, once."""
    tag = uuid.uuid4().hex[:6]
    resource, cls = f"example.com/gpu-{tag}", f"cls-{tag}"
    kube.create(kinds.GPU_CLASS, gpu_class_body(cls, resource))
    node = gpu_node({resource: 2}, name=f"restart-{tag}")["metadata"]["name"]
    operator = OperatorProcess(operator_kubeconfig, tmp_path / "operator.log", "--no-webhooks").start()
    try:
        operator.kill()
        template_device(kube, namespace, "vm-gpu-0", cls, 2)
        rid = write_request(kube, namespace, ["vm-gpu-0"], "vm")
        operator.start()
        [answered] = answer_of(kube, namespace, ["vm-gpu-0"], rid)
        assert answered["status"]["bindRequest"]["result"] == "Succeeded"
        assert answered["status"]["nodeName"] == node
        assert len(logged(operator, "bind.answered", lambda e: e["request_id"] == rid)) == 1
    finally:
        operator.stop()
        kube.delete(kinds.GPU_CLASS, cls)


def test_readiness_waits_for_the_view_and_health_answers(
    operator_kubeconfig: Path, tmp_path: Path, metrics_token: str
) -> None:
    """/readyz turns 200 only after the view synced (logged as operator.synced); /healthz and /metrics answer."""
    operator = OperatorProcess(operator_kubeconfig, tmp_path / "operator.log", "--no-webhooks").start()
    try:
        assert operator.events("operator.synced"), "ready before the view synced"
        health = requests.get(f"http://127.0.0.1:{operator.port}/healthz", timeout=2)
        assert (health.status_code, health.text) == (200, "ok")
        assert wait_for("ready", operator.ready)
        metrics = operator.metrics(metrics_token)
        assert metrics.status_code == 200
        assert "# TYPE cozygpu_devices gauge" in metrics.text
    finally:
        operator.stop()
    assert operator.events("operator.stopped")


def test_sigterm_stops_the_whole_operator_cleanly_without_a_traceback(
    operator_kubeconfig: Path, kube: Kube, gpu: Gpu, gpu_node: GPUNodeFactory, tmp_path: Path
) -> None:
    """Issue 13 item 5: SIGTERM to an operator with every watch, worker and webhook running ends it with status
    0 and `operator.stopped`, and nothing in its output is a traceback, a warning or an error (kopf's watch
    once logged "generator didn't stop after athrow()" on every stop)."""
    node = gpu_node({gpu.resource: 1})["metadata"]["name"]
    operator = OperatorProcess(operator_kubeconfig, tmp_path / "operator.log", "--dev").start()
    assert operator.proc is not None
    proc = operator.proc
    wait_for("the node accounted", lambda: kube.get_or_none(kinds.GPU_NODE, node))
    operator.stop()
    assert proc.returncode == 0
    assert operator.events("operator.stopped")
    output = operator.log_path.read_text()
    assert "Traceback" not in output and "athrow" not in output
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert [e for e in lines if e.get("level") in ("warning", "error", "critical")] == []
    assert all(line.startswith("{") for line in output.splitlines() if line.strip()), "output not from structlog"
