"""The pin that holds (§3, §12.2): on every pod rendered for the VMI, whatever KubeVirt does to the VMI's own."""

from __future__ import annotations

import pytest

from cozygpu.api import kinds
from cozygpu.devcluster.kubevirt import LAUNCHER_IMAGE
from cozygpu.kube.adapter import Body, Forbidden, Kube
from tests.support import vms
from tests.support.harness import OperatorProcess, wait_for
from tests.support.kubevirt import Nodes
from tests.support.nodes import Gpu


def rendered_for(vmi: Body, resource: str, units: int) -> Body:
    """A pod as virt-controller renders one for the VMI from its current spec (a migration target, say):
    the VMI's labels, the VMI as controlling owner, its affinity, node selector and tolerations, the GPUs."""
    meta, spec = vmi["metadata"], vmi["spec"]
    asks = {resource: str(units), "devices.kubevirt.io/kvm": "1", "cpu": "100m", "memory": "128Mi"}
    pod_spec: Body = {
        "containers": [{"name": "compute", "image": LAUNCHER_IMAGE, "resources": {"requests": asks, "limits": asks}}],
        "nodeSelector": {**(spec.get("nodeSelector") or {}), "kubevirt.io/schedulable": "true"},
        "terminationGracePeriodSeconds": 0,
    }
    for field in ("affinity", "tolerations"):
        if spec.get(field):
            pod_spec[field] = spec[field]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"virt-launcher-{meta['name']}-",
            "namespace": meta["namespace"],
            "labels": {**(meta.get("labels") or {}), "kubevirt.io": "virt-launcher"},
            "ownerReferences": [
                {
                    "apiVersion": "kubevirt.io/v1",
                    "kind": "VirtualMachineInstance",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": pod_spec,
    }


def test_a_pod_rendered_after_the_vm_controller_dropped_the_vmis_pin_still_lands_on_the_sets_node(
    kv: Kube, as_kubevirt_controller: Kube, kv_operator: OperatorProcess, ns: str, gpu: Gpu, kv_nodes: Nodes
) -> None:
    """KubeVirt's live-update sync rewrites the VMI's affinity to the VM template's (no pin); a pod rendered
    for the VMI from then on asks kube-scheduler for any node with a free unit. The pod webhook pins it, so
    kube-scheduler binds it to the set's node and not to the emptier ones."""
    # Bin-packing puts the set on the node with the fewest free units; kube-scheduler, scoring CPU and
    # memory left, would pick either big node for any pod that is free to go anywhere.
    small = kv_nodes.add(2, small=True)
    kv_nodes.add(4)
    kv_nodes.add(4)
    kv.create(kinds.VM, vms.vm_body("vm", ns, [vms.template(gpu.cls)]))
    _, launcher = vms.running(kv, ns, "vm")
    assert launcher["spec"]["nodeName"] == small

    # The VM controller's sync has run once the VMI's own pin is gone.
    synced = wait_for(
        "the VMI's pin dropped by the VM controller",
        lambda: not vms.pin_of((b := kv.get(kinds.VMI, "vm", ns))["spec"]) and b,
        timeout=30,
    )

    pod = as_kubevirt_controller.create(kinds.POD, rendered_for(synced, gpu.resource, 1))
    try:
        placed = wait_for(
            "the rendered pod bound",
            lambda: (p := kv.get(kinds.POD, pod["metadata"]["name"], ns))["spec"].get("nodeName") and p,
        )
        assert placed["spec"]["nodeName"] == small
        assert vms.pin_of(placed["spec"]) == [small]
        # The first launcher pod keeps its pin: a pod's affinity cannot change once it exists.
        assert vms.pin_of(kv.get(kinds.POD, launcher["metadata"]["name"], ns)["spec"]) == [small]
    finally:
        kv.delete(kinds.POD, pod["metadata"]["name"], ns, grace_seconds=0)


def test_a_pod_asking_for_more_units_than_its_vmis_set_holds_is_refused(
    kv: Kube, as_kubevirt_controller: Kube, kv_operator: OperatorProcess, ns: str, gpu: Gpu, kv_nodes: Nodes
) -> None:
    """§12.2: even KubeVirt's controller gets no more units for a VMI than its devices hold."""
    kv_nodes.add(4)
    kv.create(kinds.VM, vms.vm_body("vm", ns, [vms.template(gpu.cls)]))
    vmi, _ = vms.running(kv, ns, "vm")
    with pytest.raises(Forbidden) as refused:
        as_kubevirt_controller.create(kinds.POD, rendered_for(vmi, gpu.resource, 2))
    assert f"asks for more GPUs than VMI vm holds: 2 of {gpu.resource} (its devices hold 1)" in str(refused.value)


def test_a_look_alike_launcher_pod_from_anyone_else_is_refused(
    kv: Kube, kv_operator: OperatorProcess, ns: str, gpu: Gpu, kv_nodes: Nodes
) -> None:
    """§12.2: a pod labelled as a launcher, owned by a running VMI, created by someone other than KubeVirt's
    controller (an administrator here) does not get managed GPUs."""
    kv_nodes.add(4)
    kv.create(kinds.VM, vms.vm_body("vm", ns, [vms.template(gpu.cls)]))
    vmi, _ = vms.running(kv, ns, "vm")
    with pytest.raises(Forbidden) as refused:
        kv.create(kinds.POD, rendered_for(vmi, gpu.resource, 1))
    assert "only KubeVirt's controller (system:serviceaccount:kubevirt:kubevirt-controller)" in str(refused.value)


def test_a_launcher_pod_with_an_unmanaged_resource_is_untouched(
    kv: Kube, as_kubevirt_controller: Kube, kv_operator: OperatorProcess, ns: str, gpu: Gpu, kv_nodes: Nodes
) -> None:
    """A resource no GPUClass names is not the operator's: the pod is created as rendered, without a pin."""
    kv_nodes.add(4)
    kv.create(kinds.VM, vms.vm_body("vm", ns, [vms.template(gpu.cls)]))
    vmi, _ = vms.running(kv, ns, "vm")
    body = rendered_for(vmi, "example.com/not-a-gpu", 1)
    body["spec"].pop("affinity", None)
    pod = as_kubevirt_controller.create(kinds.POD, body)
    try:
        assert vms.pin_of(pod["spec"]) == []
    finally:
        kv.delete(kinds.POD, pod["metadata"]["name"], ns, grace_seconds=0)
