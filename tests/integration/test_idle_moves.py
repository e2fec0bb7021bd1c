"""§5.7 idle moves in the operator process, through the real API server.

Two 8-unit nodes, each with a 2-unit device another tenant holds for a stopped VM (Bound, attached to no
VMI): an 8-unit device fits on neither until one of those reservations moves. Each test has its own
resource name and class, so other tests' nodes never compete for its units.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cozygpu.api import kinds
from cozygpu.devcluster import nodes
from cozygpu.kube.adapter import Kube
from tests.support.bodies import gpu_class_body, gpu_device_body
from tests.support.harness import OperatorProcess, logged, wait_for
from tests.support.nodes import Gpu, GPUNodeFactory, fresh_gpu, wait_until_accounted
from tests.support.operators import start_operator

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def operator(operator_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """The operator without webhooks, with the default bound on idle moves per decision; a device may move as soon
    as it is idle (the wait before is a unit test's: tests/unit/runtime/workers/binder/test_binder_idle_moves.py)."""
    process = start_operator(
        operator_kubeconfig, tmp_path_factory.mktemp("idle-moves"), "--no-webhooks", "--idle-move-after", "0"
    )
    yield process
    process.stop()


@pytest.fixture
def other(kube: Kube) -> Iterator[str]:
    """The tenant whose idle reservations move: a namespace of its own."""
    name = f"o-{uuid.uuid4().hex[:8]}"
    kube.create(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    kube.delete(kinds.NAMESPACE, name)


def _status(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = kube.get(kinds.GPU_DEVICE, name, namespace).get("status", {})
    return result


def _bound_on(kube: Kube, namespace: str, name: str) -> str | None:
    s = _status(kube, namespace, name)
    return s.get("nodeName") if s.get("phase") == "Bound" else None


def _cloud(kube: Kube, gpu: Gpu, gpu_node: GPUNodeFactory, other: str) -> dict[str, str]:
    """Two 8-unit nodes with 6 free each and a 2-unit idle device of `other` on each; {device: node}."""
    first = gpu_node({gpu.resource: 8}, name=f"a-{gpu.cls}")["metadata"]["name"]
    second = gpu_node({gpu.resource: 2}, name=f"b-{gpu.cls}")["metadata"]["name"]
    placed = {}
    for name, where in (("idle-1", second), ("idle-2", first)):  # best fit: the 2-unit node first, then the other
        kube.create(kinds.GPU_DEVICE, gpu_device_body(name, other, gpu.cls, 2))
        placed[name] = wait_for(f"{name} bound", lambda n=name: _bound_on(kube, other, n))
        assert placed[name] == where
    nodes.set_gpus(kube, second, {gpu.resource: 8})
    wait_until_accounted(kube, second, {gpu.resource: 8}, {})
    return placed


def test_an_eight_gpu_device_is_bound_after_one_idle_reservation_moves(
    operator: OperatorProcess, kube: Kube, namespace: str, other: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """§5.7: one idle device moves to the other node, the 8-unit device takes the node it left; no node holds
    more than 8, the moved device's tenant gets a Moved Event that does not name the order, the log does."""
    placed = _cloud(kube, gpu, gpu_node, other)
    kube.create(kinds.GPU_DEVICE, gpu_device_body("big", namespace, gpu.cls, 8))
    home = wait_for("big bound", lambda: _bound_on(kube, namespace, "big"))
    now = {name: _bound_on(kube, other, name) for name in placed}
    moved = [name for name in placed if now[name] != placed[name]]
    assert len(moved) == 1 and placed[moved[0]] == home and now[moved[0]] not in (None, home)
    assert set(now.values()) == {now[moved[0]]}  # both idle reservations now share the other node

    def told() -> list[dict[str, Any]]:
        return [e for e in kube.list(kinds.kind("Event"), other) if e["reason"] == "Moved"]

    (event,) = wait_for("a Moved Event", told)
    assert event["involvedObject"]["name"] == moved[0] and "attached to no VMI" in event["message"]
    assert namespace not in event["message"] and "big" not in event["message"]
    line = logged(operator, "device.moved", lambda e: e["device"] == moved[0])[0]
    assert line["for_namespace"] == namespace and line["for_devices"] == ["big"] and line["to"] == now[moved[0]]


def test_a_class_that_forbids_idle_moves_leaves_the_eight_gpu_device_waiting(
    operator: OperatorProcess, kube: Kube, namespace: str, other: str, gpu_node: GPUNodeFactory
) -> None:
    """GPUClass.spec.idleMoves: Never: its idle reservations stay and the order waits Pending, saying why."""
    gpu = fresh_gpu()
    kube.create(kinds.GPU_CLASS, gpu_class_body(gpu.cls, gpu.resource, idleMoves="Never"))
    try:
        placed = _cloud(kube, gpu, gpu_node, other)
        kube.create(kinds.GPU_DEVICE, gpu_device_body("big", namespace, gpu.cls, 8))
        message = wait_for(
            "big pending",
            lambda: (
                _status(kube, namespace, "big").get("phase") == "Pending"
                and _status(kube, namespace, "big").get("message")
            ),
        )
        assert "8" in str(message)
        # A Pending device is decided again only when room appears; nothing more happens to these.
        assert {name: _bound_on(kube, other, name) for name in placed} == placed
        assert not [e for e in kube.list(kinds.kind("Event"), other) if e["reason"] == "Moved"]
    finally:
        kube.delete(kinds.GPU_CLASS, gpu.cls)


def test_an_idle_device_leaves_a_cordoned_node_so_the_node_can_go_without_a_device_lost(
    operator: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """§6.8 (issue 37 item 4): a node cordoned for maintenance; the idle held device on it moves to the other node,
    its tenant told why by a `Moved` Event; the node deleted afterwards leaves the device Bound, not Lost."""
    first = gpu_node({gpu.resource: 8}, name=f"a-{gpu.cls}")["metadata"]["name"]
    second = gpu_node({gpu.resource: 8}, name=f"b-{gpu.cls}")["metadata"]["name"]
    kube.create(kinds.GPU_DEVICE, gpu_device_body("idle", namespace, gpu.cls, 2))
    home = wait_for("idle bound", lambda: _bound_on(kube, namespace, "idle"))
    away = second if home == first else first
    kube.patch(kinds.NODE, home, {"spec": {"unschedulable": True}})
    assert wait_for("idle moved off the cordoned node", lambda: _bound_on(kube, namespace, "idle") == away or None)

    def told() -> list[str] | None:
        said = [e.get("message", "") for e in kube.list(kinds.kind("Event"), namespace) if e.get("reason") == "Moved"]
        return [m for m in said if "node maintenance" in m and home in m] or None

    assert wait_for("the Moved Event", told)
    kube.delete(kinds.NODE, home)
    with pytest.raises(AssertionError, match="timed out"):
        wait_for("idle Lost", lambda: _status(kube, namespace, "idle").get("phase") == "Lost" or None, timeout=3)
    assert _bound_on(kube, namespace, "idle") == away
