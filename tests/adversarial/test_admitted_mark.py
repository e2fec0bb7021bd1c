"""Issue 34 item 4 (§12.3): the VMI webhook's `gpu.cozystack.io/admitted` mark is an annotation a tenant can write.

With the operator's mutating configuration gone (an admin unsticking an outage deletes it), mallory, holding her
namespace's tenant and `edit` roles, creates a labelled VMI carrying the mark and a `gpus` entry of its own: before,
the no-bypass policy let it through, and its launcher got a GPU nothing pinned or counted. The second policy takes
the configuration itself as its parameter, and mallory cannot stand in for it.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from cozygpu.api import kinds
from cozygpu.api.names import ANNOTATION_ADMITTED
from cozygpu.kube.adapter import ApiError, Forbidden, Kube
from cozygpu.runtime.admission import policy, webhooks
from tests.support.bodies import gpu_device_body, vmi_body
from tests.support.harness import wait_for
from tests.support.nodes import Gpu, GPUNodeFactory
from tests.support.operators import start_admitting_operator, unregister_webhooks
from tests.support.tenants import Tenant

pytestmark = [pytest.mark.integration, pytest.mark.adversarial]


def _forged(name: str, namespace: str, resource: str) -> dict[str, object]:
    domain = {
        "devices": {"gpus": [{"name": "mine", "deviceName": resource}]},
        "resources": {"requests": {"memory": "1Gi"}},
    }
    body = vmi_body(name, namespace, [{"device": "held"}], domain=domain)
    body["metadata"]["annotations"][ANNOTATION_ADMITTED] = "true"
    return body


def test_a_tenant_forging_the_mark_gets_no_gpu_and_cannot_stand_in_for_the_configuration(
    operator_kubeconfig: Path, kube: Kube, mallory: Tenant, gpu: Gpu, gpu_node: GPUNodeFactory, tmp_path: Path
) -> None:
    """With the configuration deleted, mallory's forged VMI is refused by the policy that needs it; she may neither
    create a configuration carrying its label nor change the policy's binding."""
    gpu_node({gpu.resource: 2})
    process = start_admitting_operator(operator_kubeconfig, tmp_path)
    try:
        mallory.kube.create(kinds.GPU_DEVICE, gpu_device_body("held", mallory.namespace, gpu.cls))
        mine = copy.deepcopy(kube.get(kinds.MUTATING_WEBHOOKS, webhooks.MUTATING_NAME))
    finally:
        process.stop()  # dev mode takes its configurations away: what an admin unsticking an outage does
    try:
        assert kube.get_or_none(kinds.MUTATING_WEBHOOKS, webhooks.MUTATING_NAME) is None

        def refused() -> str | None:
            try:
                mallory.kube.create(kinds.VMI, _forged("forged", mallory.namespace, gpu.resource))
            except ApiError as e:
                return e.message
            mallory.kube.delete(kinds.VMI, "forged", mallory.namespace)
            return None

        assert f"ValidatingAdmissionPolicy '{policy.WEBHOOKS_NAME}'" in wait_for("the forged VMI refused", refused, 15)
        assert kube.get_or_none(kinds.VMI, "forged", mallory.namespace) is None
        # Standing in for the operator: a configuration with its label (pointing nowhere), or a binding that
        # selects something else, is a cluster admin's to write, not a tenant's.
        meta = {"name": "mallorys", "labels": mine["metadata"]["labels"]}
        stand_in = {
            "apiVersion": mine["apiVersion"],
            "kind": mine["kind"],
            "metadata": meta,
            "webhooks": mine["webhooks"],
        }
        with pytest.raises(Forbidden):
            mallory.kube.create(kinds.MUTATING_WEBHOOKS, stand_in)
        with pytest.raises(Forbidden):
            mallory.kube.patch(kinds.POLICY_BINDING, policy.WEBHOOKS_NAME, {"spec": {"validationActions": ["Audit"]}})
    finally:
        unregister_webhooks(kube)
