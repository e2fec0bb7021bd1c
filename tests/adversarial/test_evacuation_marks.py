"""Issue 37 item 6 (§6.8, §14): what a tenant can do with the evacuation mark, with KubeVirt in the loop.

virt-api marks a VMI for evacuation (`status.evacuationNodeName`) when a launcher's eviction is refused, and the
operator acts on the mark. KubeVirt keeps no status subresource for VMIs: a tenant holding `kubevirt.io:edit` may
update her own VMIs whole, and virt-api's VMI mutator puts the old status back on any update from someone other
than KubeVirt's service accounts. So she cannot mark her own VMI, nor reach another tenant's. (Where that webhook
is missing, the operator still acts on a mark only off a cordoned node her set is on:
tests/unit/runtime/workers/binder/test_vm_evacuation.py.)
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


def _vm(kv: Kube, tenant: Tenant, gpu: Gpu) -> tuple[dict[str, object], str]:
    """The tenant's VM with a template GPU, running (watched with the admin's eyes); its VMI and node."""
    tenant.kube.create(kinds.VM, vms.vm_body("vm", tenant.namespace, [vms.template(gpu.cls)], eviction="External"))
    vmi, pod = vms.running(kv, tenant.namespace, "vm")
    return vmi, pod["spec"]["nodeName"]


def _mark(tenant: Tenant, namespace: str, node: str) -> None:
    tenant.kube.patch(kinds.VMI, "vm", {"status": {"evacuationNodeName": node}}, namespace)


def test_a_tenant_marks_only_her_own_vmi_and_her_mark_off_a_node_not_drained_moves_nothing(
    kv: Kube, kv_operator: OperatorProcess, kv_mallory: Tenant, kv_victim: Tenant, kv_gpu: Gpu, kv_node: KVNodeFactory
) -> None:
    """mallory's write of the victim's VMI is Forbidden. Her writes of the mark on her own VMI, off her node and off
    the victim's node being drained, are taken as requests and their status dropped by virt-api: her VM keeps
    running as it was (the same VMI, node and device), the victim's is untouched, and no GPUNode shows an
    evacuation."""
    kv_node(1)
    kv_node(1)
    victim_vmi, victims_node = _vm(kv, kv_victim, kv_gpu)
    mine, my_node = _vm(kv, kv_mallory, kv_gpu)
    assert my_node != victims_node  # one unit each: two nodes

    with pytest.raises(Forbidden):
        _mark(kv_mallory, kv_victim.namespace, victims_node)

    _mark(kv_mallory, kv_mallory.namespace, my_node)
    stored = kv.get(kinds.VMI, "vm", kv_mallory.namespace)
    assert "evacuationNodeName" not in stored["status"]  # virt-api's mutator put the old status back

    kv.patch(kinds.NODE, victims_node, {"spec": {"unschedulable": True}})  # the platform drains the victim's node
    try:
        _mark(kv_mallory, kv_mallory.namespace, victims_node)
        time.sleep(LOOK)
        assert "evacuationNodeName" not in kv.get(kinds.VMI, "vm", kv_mallory.namespace)["status"]
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
