"""§6.4's safety net for the view itself: a resync against the real API server forgets what was removed unseen.

The Operator runs in the test process with no watch at all, which is what a watch gap (or the start-up race
between the operator's list and its watch's) looks like from inside: deletions happen, no event says so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cozygpu.api import kinds
from cozygpu.kube.adapter import Kube
from cozygpu.runtime.process.app import Operator
from cozygpu.settings import Settings
from tests.support.bodies import gpu_device_body, vmi_body
from tests.support.nodes import Gpu

pytestmark = pytest.mark.integration


async def test_a_resync_forgets_what_was_removed_unseen_and_keeps_the_rest(
    operator_kubeconfig: Path, kube: Kube, namespace: str, gpu: Gpu
) -> None:
    """A device and a VMI deleted with no event seen are dropped from the view; what still exists stays."""
    operator = Operator(Settings(kubeconfig=operator_kubeconfig, webhook_mode="off"))
    kube.create(kinds.GPU_DEVICE, gpu_device_body("real", namespace, gpu.cls))
    kube.create(kinds.GPU_DEVICE, gpu_device_body("ghost", namespace, gpu.cls))
    plain = vmi_body("vm", namespace, None)
    del plain["metadata"]["labels"]["gpu.cozystack.io/device-reference"]
    kube.create(kinds.VMI, plain)
    await operator.resync()
    assert operator.cluster.devices.get((namespace, "ghost")) is not None
    assert (namespace, "vm") in operator.cluster.vmis

    kube.delete(kinds.GPU_DEVICE, "ghost", namespace)
    kube.delete(kinds.VMI, "vm", namespace)
    assert operator.cluster.devices.get((namespace, "ghost")) is not None  # nothing told the view

    assert await operator.resync() >= 2
    assert operator.cluster.devices.get((namespace, "ghost")) is None
    assert (namespace, "vm") not in operator.cluster.vmis
    assert operator.cluster.devices.get((namespace, "real")) is not None
    assert gpu.cls in operator.cluster.classes
    assert await operator.resync() == 0
