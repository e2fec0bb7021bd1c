"""Issue 19 items 2 and 6 (§14.2, §3): what a tenant can do with a VMI's name alone.

A create of a name a VMI already holds reaches the mutating webhook before the API server
answers AlreadyExists, so whatever the webhook wrote for it would stay; a name too long for the
template devices it makes reached the API server as a 500. Both are denials that write nothing.
"""

from __future__ import annotations

import pytest

from cozygpu.api import kinds
from cozygpu.api.names import FINALIZER_IN_USE
from cozygpu.devcluster.bodies import vmi_body
from cozygpu.kube.adapter import ApiError, Kube
from tests.support.harness import OperatorProcess, wait_for
from tests.support.invariants import assert_invariants
from tests.support.nodes import Gpu, GPUNodeFactory
from tests.support.objects import device_status, held
from tests.support.tenants import Tenant

pytestmark = [pytest.mark.integration, pytest.mark.adversarial]


def test_a_second_create_of_a_running_vmis_name_writes_nothing(
    admitting: OperatorProcess, kube: Kube, mallory: Tenant, victim: Tenant, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """§14.2: while `v` runs with `d1`, a create of `v` naming `d1` and `d2` is refused before any write: `d2` is
    not attached to the running VMI, and `d1` keeps its request and node (the API server's AlreadyExists comes
    only after admission, too late to undo what the webhook wrote)."""
    gpu_node({gpu.resource: 2}, name=f"one-{gpu.cls}")
    gpu_node({gpu.resource: 2}, name=f"two-{gpu.cls}")
    ns = mallory.namespace
    held(mallory.kube, ns, "d1", gpu.cls)
    uid = mallory.kube.create(kinds.VMI, vmi_body("v", ns, [{"device": "d1"}]))["metadata"]["uid"]
    held(mallory.kube, ns, "d2", gpu.cls)
    # §6.1, §6.5: the collector's writes for the VMI's appearance (its uid, the in-use finalizer) come first.
    d1 = wait_for(
        "d1 claimed by v",
        lambda: (
            (d := mallory.kube.get(kinds.GPU_DEVICE, "d1", ns))["status"]["attachedTo"].get("uid") == uid
            and FINALIZER_IN_USE in d["metadata"].get("finalizers", [])
            and d
        ),
    )
    with pytest.raises(ApiError) as raised:
        mallory.kube.create(kinds.VMI, vmi_body("v", ns, [{"device": "d1"}, {"device": "d2"}]))
    # What the create wrote first, then how it was answered (a 409 after admission comes too late).
    assert "attachedTo" not in device_status(mallory.kube, ns, "d2")
    after = mallory.kube.get(kinds.GPU_DEVICE, "d1", ns)
    assert after["metadata"]["resourceVersion"] == d1["metadata"]["resourceVersion"]
    assert raised.value.status == 403, raised.value.message
    assert f"VMI v already exists in namespace {ns}" in raised.value.message
    assert_invariants(kube, (mallory, victim), admitting)


def test_a_vmi_name_too_long_for_its_gpu_devices_is_a_denial_not_an_error(
    admitting: OperatorProcess, kube: Kube, mallory: Tenant, victim: Tenant, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """A name whose `<vmi>-gpu-<i>` is no valid object name is refused naming the entry, not answered 500 (the API
    server checks the VMI's own name only after the mutating webhooks)."""
    gpu_node({gpu.resource: 1}, name=f"long-{gpu.cls}")
    ns = mallory.namespace
    name = "v" * 250
    with pytest.raises(ApiError) as raised:
        mallory.kube.create(kinds.VMI, vmi_body(name, ns, [{"deviceTemplate": {"className": gpu.cls, "count": 1}}]))
    assert raised.value.status == 403, raised.value.message
    assert 'admission webhook "vmi.gpu.cozystack.io" denied the request' in raised.value.message
    assert "made from the VMI's name is not a valid object name" in raised.value.message
    assert mallory.kube.list(kinds.GPU_DEVICE, ns) == []
    assert_invariants(kube, (mallory, victim), admitting)
