"""Issue 34 item 6 (§14): what a tenant reads of a placement that failed names no node.

GPUNodes are cluster-scoped and tenants cannot read them; a device that fits nowhere used to wait with the closest
nodes' names, free units and states in its status, and a refused VMI carried them in its refusal. Mallory orders
more than any node has free: her device's message and Events say what is missing, and name no node.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cozygpu.api import kinds
from cozygpu.kube.adapter import Kube
from tests.support.bodies import gpu_device_body
from tests.support.harness import logged, wait_for
from tests.support.nodes import Gpu, GPUNodeFactory
from tests.support.operators import start_admitting_operator, unregister_webhooks
from tests.support.tenants import Tenant

pytestmark = [pytest.mark.integration, pytest.mark.adversarial]


def test_a_device_that_fits_nowhere_tells_its_tenant_what_is_missing_not_which_nodes_have_what(
    operator_kubeconfig: Path, kube: Kube, mallory: Tenant, gpu: Gpu, gpu_node: GPUNodeFactory, tmp_path: Path
) -> None:
    """The status message says the units, resource and class; the nodes' reasons are in the platform's log only
    (her own device's node is hers to know: it is in its status)."""
    first = gpu_node({gpu.resource: 2})["metadata"]["name"]
    second = gpu_node({gpu.resource: 2}, unschedulable=True)["metadata"]["name"]
    process = start_admitting_operator(operator_kubeconfig, tmp_path)
    try:
        mallory.kube.create(kinds.GPU_DEVICE, gpu_device_body("small", mallory.namespace, gpu.cls))
        wait_for(
            "the small one Bound",
            lambda: (
                (mallory.kube.get(kinds.GPU_DEVICE, "small", mallory.namespace).get("status") or {}).get("phase")
                == "Bound"
            ),
        )
        mallory.kube.create(kinds.GPU_DEVICE, gpu_device_body("big", mallory.namespace, gpu.cls, count=2))

        def waiting() -> str | None:
            status = mallory.kube.get(kinds.GPU_DEVICE, "big", mallory.namespace).get("status") or {}
            return status.get("message") if status.get("phase") == "Pending" else None

        message = wait_for("mallory's device waiting", waiting)
        assert message == f"no node has 2 free units of {gpu.resource} matching GPUClass {gpu.cls}"
        events = kube.list(kinds.kind("Event"), mallory.namespace)  # hers to read
        said = " ".join(e.get("message", "") for e in events if e["involvedObject"]["name"] == "big")
        for node in (first, second):
            assert node not in message and node not in said
        why = logged(process, "device.waiting", lambda e: e.get("device") == "big")
        assert any(f"node {first} has 1 free" in (e.get("detail") or "") for e in why)
    finally:
        process.stop()
        unregister_webhooks(kube)
