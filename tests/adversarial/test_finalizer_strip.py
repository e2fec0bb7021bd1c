"""Issue 19 item 3 (§6.7): a tenant strips its VMI's finalizers while the launcher pod still runs the guest.

KubeVirt in the loop: virt-controller renders the launcher pod, kube-scheduler binds it, the
fake kubelet runs it; a finalizer the test puts on the pod plays a kubelet slow to stop it.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest

from cozygpu.api import kinds
from cozygpu.kube.adapter import ApiError, Body, Kube
from tests.support import vms
from tests.support.bodies import gpu_device_body
from tests.support.harness import OperatorProcess, wait_for
from tests.support.invariants import assert_invariants
from tests.support.kubevirt import KVNodeFactory
from tests.support.nodes import Gpu
from tests.support.tenants import Tenant

pytestmark = [pytest.mark.kubevirt, pytest.mark.adversarial]

SLOW_KUBELET = "cozy.test/slow-kubelet"
ENDED = ("Succeeded", "Failed")


def bare_vmi(name: str, namespace: str, refs: list[dict[str, Any]]) -> Body:
    """A VMI a tenant creates itself (no VM), as KubeVirt would make it from vms.vm_body's template."""
    template = vms.vm_body(name, namespace, refs)["spec"]["template"]
    meta = {**template["metadata"], "name": name, "namespace": namespace}
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": meta,
        "spec": template["spec"],
    }


def bound(kube: Kube, namespace: str, name: str) -> str:
    body = wait_for(
        f"GPUDevice {name} Bound",
        lambda: (d := kube.get(kinds.GPU_DEVICE, name, namespace)).get("status", {}).get("phase") == "Bound" and d,
    )
    node: str = body["status"]["nodeName"]
    return node


def strip(kv: Kube, mallory: Tenant, name: str) -> tuple[str, str]:
    """Run `name` until its launcher runs and the set has its uid; slow its kubelet down; then, as mallory,
    delete the VMI and strip its finalizers until the object is gone. The old uid and launcher pod's name."""
    ns = mallory.namespace
    vmi, pod = vms.running(kv, ns, name)
    uid, launcher = vmi["metadata"]["uid"], pod["metadata"]["name"]
    wait_for(
        "the uid recorded",
        lambda: (kv.get(kinds.GPU_DEVICE, "keep", ns)["status"].get("attachedTo") or {}).get("uid") == uid,
    )
    kv.patch(kinds.POD, launcher, {"metadata": {"finalizers": [SLOW_KUBELET]}}, ns)
    mallory.kube.delete(kinds.VMI, name, ns)
    wait_for("the pod terminating", lambda: kv.get(kinds.POD, launcher, ns)["metadata"].get("deletionTimestamp"))
    mallory.kube.patch(kinds.VMI, name, {"metadata": {"finalizers": None}}, ns)
    wait_for("the VMI object gone", lambda: vms.vmi(kv, ns, name) is None)
    return uid, launcher


def test_a_stripped_vmis_set_stays_until_its_guest_is_gone(
    kv: Kube,
    kv_operator: OperatorProcess,
    kv_gpu: Gpu,
    kv_node: KVNodeFactory,
    kv_mallory: Tenant,
    kv_victim: Tenant,
) -> None:
    """§6.7: mallory deletes her bare VMI and strips its finalizers while its launcher still runs: the held device
    stays attached and the template device stays, so their units are given to no one (the victim's order for
    them waits); once the pod is gone, the held device is detached and the template one deleted."""
    ns = kv_mallory.namespace
    home = kv_node(2)
    kv_mallory.kube.create(kinds.GPU_DEVICE, gpu_device_body("keep", ns, kv_gpu.cls))
    assert bound(kv, ns, "keep") == home
    kv_mallory.kube.create(kinds.VMI, bare_vmi("bare", ns, [vms.held("keep"), vms.template(kv_gpu.cls)]))
    uid, launcher = strip(kv, kv_mallory, "bare")
    try:
        kv_victim.kube.create(kinds.GPU_DEVICE, gpu_device_body("mine", kv_victim.namespace, kv_gpu.cls))
        time.sleep(2)  # the collector and the binder have had their turn with the deletion and the order
        keep = kv.get(kinds.GPU_DEVICE, "keep", ns)["status"]
        assert (keep["attachedTo"]["uid"], keep["nodeName"]) == (uid, home)
        assert kv.get_or_none(kinds.GPU_DEVICE, "bare-gpu-1", ns) is not None
        assert kv.get(kinds.GPU_DEVICE, "mine", kv_victim.namespace).get("status", {}).get("phase") != "Bound"
        assert_invariants(kv, (kv_mallory, kv_victim), kv_operator)
    finally:
        kv.patch(kinds.POD, launcher, {"metadata": {"finalizers": None}}, ns)
    wait_for("the held device detached", lambda: "attachedTo" not in kv.get(kinds.GPU_DEVICE, "keep", ns)["status"])
    wait_for("the template device deleted", lambda: kv.get_or_none(kinds.GPU_DEVICE, "bare-gpu-1", ns) is None)
    assert bound(kv, kv_victim.namespace, "mine") == home  # the units, free now, go to the next in line
    assert_invariants(kv, (kv_mallory, kv_victim), kv_operator)


def launchers_use(kube: Kube, namespace: str, node: str, resource: str) -> int:
    """Units of `resource` the namespace's pods that have not ended use on the node."""
    pods = kube.list(kinds.POD, namespace)
    live = [p for p in pods if p["spec"].get("nodeName") == node and p["status"].get("phase") not in ENDED]
    return sum(vms.gpu_units(p, resource) for p in live)


def test_a_stripped_vmis_name_created_again_never_uses_its_units_twice(
    kv: Kube,
    kv_operator: OperatorProcess,
    kv_gpu: Gpu,
    kv_node: KVNodeFactory,
    kv_mallory: Tenant,
    kv_victim: Tenant,
) -> None:
    """§6.7: after the strip, mallory creates the name again naming the same held device, on a node with room for
    a second launcher: the set's units are never counted for two guests (every unit a launcher uses is counted on
    the node), so the victim's order is never placed on units mallory's launchers use."""
    ns = kv_mallory.namespace
    home = kv_node(4)
    kv_mallory.kube.create(kinds.GPU_DEVICE, gpu_device_body("keep", ns, kv_gpu.cls))
    assert bound(kv, ns, "keep") == home
    kv_mallory.kube.create(kinds.VMI, bare_vmi("bare", ns, [vms.held("keep")]))
    _, launcher = strip(kv, kv_mallory, "bare")
    try:
        # The new VMI may take the set over; its launcher is refused while the old one holds the units (§6.7).
        with contextlib.suppress(ApiError):
            kv_mallory.kube.create(kinds.VMI, bare_vmi("bare", ns, [vms.held("keep")]))
            time.sleep(4)  # virt-controller and kube-scheduler have had their turns with it
        kv_victim.kube.create(kinds.GPU_DEVICE, gpu_device_body("mine", kv_victim.namespace, kv_gpu.cls, 3))
        time.sleep(2)  # the binder has had its turn with the order
        mine = kv.get(kinds.GPU_DEVICE, "mine", kv_victim.namespace).get("status", {})
        used = launchers_use(kv, ns, home, kv_gpu.resource)
        assert (mine.get("phase"), mine.get("nodeName")) != ("Bound", home) or used + 3 <= 4, (
            f"the victim's 3 units were placed on {home}, where mallory's launchers use {used} of 4"
        )
        assert_invariants(kv, (kv_mallory, kv_victim), kv_operator)
    finally:
        kv.patch(kinds.POD, launcher, {"metadata": {"finalizers": None}}, ns)
    assert_invariants(kv, (kv_mallory, kv_victim), kv_operator)


def unmanaged_units(kube: Kube, node: str, resource: str) -> int:
    """The GPUNode's units of `resource` held by pods the operator did not place."""
    status = (kube.get_or_none(kinds.GPU_NODE, node) or {}).get("status") or {}
    return next((r.get("unmanaged", 0) for r in status.get("resources", []) if r["name"] == resource), 0)


def test_a_running_launcher_cannot_be_relabelled_or_unowned_to_hide_its_guest(
    kv: Kube,
    kv_operator: OperatorProcess,
    kv_gpu: Gpu,
    kv_node: KVNodeFactory,
    kv_mallory: Tenant,
    kv_victim: Tenant,
) -> None:
    """Issue 34 item 1: mallory, with her namespace's `edit` role (pod rights), relabels her running launcher
    (`kubevirt.io=x`, or no label) or takes its VMI controller reference off, so the operator would count the guest
    as gone and a finalizer strip would free its units for another while it runs. Each change is refused by the
    no-bypass policy, naming the pod; the guest stays the operator's and KubeVirt's, and nothing shows as held
    behind the operator's back. Before, the relabel was admitted and the launcher left the operator's view."""
    ns = kv_mallory.namespace
    home = kv_node(2)
    kv_mallory.kube.create(kinds.GPU_DEVICE, gpu_device_body("keep", ns, kv_gpu.cls))
    assert bound(kv, ns, "keep") == home
    kv_mallory.kube.create(kinds.VMI, bare_vmi("bare", ns, [vms.held("keep"), vms.template(kv_gpu.cls)]))
    _, pod = vms.running(kv, ns, "bare")
    launcher = pod["metadata"]["name"]
    for change in ({"labels": {"kubevirt.io": "x"}}, {"labels": {"kubevirt.io": None}}, {"ownerReferences": None}):
        with pytest.raises(ApiError, match=f"Pod {launcher} holds {kv_gpu.resource}") as refused:
            kv_mallory.kube.patch(kinds.POD, launcher, {"metadata": change}, ns)
        assert refused.value.status == 403
    stored = kv.get(kinds.POD, launcher, ns)["metadata"]
    assert stored["labels"]["kubevirt.io"] == "virt-launcher" and stored["ownerReferences"][0]["kind"] == (
        "VirtualMachineInstance"
    )
    time.sleep(2)  # the operator has heard whatever the attempts caused
    assert unmanaged_units(kv, home, kv_gpu.resource) == 0
    assert_invariants(kv, (kv_mallory, kv_victim), kv_operator)
    kv_mallory.kube.delete(kinds.VMI, "bare", ns)
    wait_for("the template device deleted", lambda: kv.get_or_none(kinds.GPU_DEVICE, "bare-gpu-1", ns) is None)
