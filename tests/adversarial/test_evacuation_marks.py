"""Issue 37 item 6 (§6.8, §14): what a tenant can do with the evacuation mark, with KubeVirt in the loop.

virt-api marks a VMI for evacuation (`status.evacuationNodeName`) when a launcher's eviction is refused, and the
operator acts on the mark. KubeVirt keeps no status subresource for VMIs and its update admitter restricts only the
spec and KubeVirt's labels, so a tenant holding `kubevirt.io:edit` can write that field on her own VMIs, and on no
one else's. The operator acts on a mark only off a cordoned node her set is on: her own mark elsewhere moves and
restarts nothing, and she cannot reach another tenant's VMI at all.
"""

from __future__ import annotations

import time

import pytest

from cozygpu.api import kinds
from cozygpu.kube.adapter import Forbidden, Kube
from tests.support import vms
from tests.support.harness import OperatorProcess
from tests.support.kubevirt import KVNodeFactory
from tests.support.nodes import Gpu
from tests.support.tenants import Tenant

pytestmark = [pytest.mark.kubevirt, pytest.mark.adversarial]

LOOK = 5.0  # seconds the operator gets to act on a mark it must ignore (it acts within a pass, milliseconds)


def _vm(tenant: Tenant, gpu: Gpu) -> tuple[dict[str, object], str]:
    tenant.kube.create(kinds.VM, vms.vm_body("vm", tenant.namespace, [vms.template(gpu.cls)], eviction="External"))
    vmi, pod = vms.running(tenant.kube, tenant.namespace, "vm")
    return vmi, pod["spec"]["nodeName"]


def _mark(tenant: Tenant, namespace: str, node: str) -> None:
    tenant.kube.patch(kinds.VMI, "vm", {"status": {"evacuationNodeName": node}}, namespace)


def test_a_tenant_marks_only_her_own_vmi_and_her_mark_off_a_node_not_drained_moves_nothing(
    kv: Kube, kv_operator: OperatorProcess, kv_mallory: Tenant, kv_victim: Tenant, kv_gpu: Gpu, kv_node: KVNodeFactory
) -> None:
    """mallory's write of the victim's VMI status is Forbidden. Her own VMI takes the mark (KubeVirt lets her), off
    her node (not cordoned) and off a cordoned node her set is not on: her VM keeps running as it was, the same
    VMI on the same node with the same device, and no node's GPUNode shows an evacuation."""
    kv_node(1)
    kv_node(1)
    victim_vmi, victims_node = _vm(kv_victim, kv_gpu)
    mine, my_node = _vm(kv_mallory, kv_gpu)
    assert my_node != victims_node  # one unit each: two nodes

    with pytest.raises(Forbidden):
        _mark(kv_mallory, kv_victim.namespace, victims_node)

    _mark(kv_mallory, kv_mallory.namespace, my_node)
    stored = kv.get(kinds.VMI, "vm", kv_mallory.namespace)
    assert stored["status"].get("evacuationNodeName") == my_node  # KubeVirt took her write

    kv.patch(kinds.NODE, victims_node, {"spec": {"unschedulable": True}})  # the platform drains the victim's node
    try:
        _mark(kv_mallory, kv_mallory.namespace, victims_node)
        time.sleep(LOOK)
        now = kv.get(kinds.VMI, "vm", kv_mallory.namespace)
        assert now["metadata"]["uid"] == mine["metadata"]["uid"] and now["status"].get("nodeName") == my_node
        device = kv.get(kinds.GPU_DEVICE, "vm-gpu-0", kv_mallory.namespace)
        assert device["status"]["nodeName"] == my_node
        victims = kv.get(kinds.VMI, "vm", kv_victim.namespace)
        assert victims["metadata"]["uid"] == victim_vmi["metadata"]["uid"]  # not marked: its drain is KubeVirt's ask
        for node in (my_node, victims_node):
            conditions = (kv.get(kinds.GPU_NODE, node).get("status") or {}).get("conditions") or []
            evacuation = next(c for c in conditions if c["type"] == "Evacuation")
            assert evacuation["status"] == "False", evacuation
    finally:
        kv.patch(kinds.NODE, victims_node, {"spec": {"unschedulable": False}})
