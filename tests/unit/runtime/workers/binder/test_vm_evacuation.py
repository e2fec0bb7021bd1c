"""§6.8, issue 37 items 1-3: a VM KubeVirt marked for evacuation off a node being drained (eviction strategy
`External`) restarts on a node reserved for its whole set before it stops; with no such node it keeps running and
says why; paced; carried out by the binder through the view and the one writer, against the in-memory API. The
same with KubeVirt's own controllers in the loop: tests/kubevirt/test_drain.py."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import structlog

from cozygpu.api import kinds
from cozygpu.api.names import ANNOTATION_DEVICES, LABEL_DEVICE_REFERENCE, REASON_EVACUATING, TRUE
from cozygpu.decisions import evacuation
from cozygpu.decisions.lifecycle import Do, device_actions, status_after
from cozygpu.decisions.nodestatus import gpunode_status
from cozygpu.runtime.view import View
from cozygpu.runtime.workers.binder import Binder
from tests.support.memkube import MemKube
from tests.support.views import A10, EPOCH, device, gpu_class, node, pod
from tests.support.workers import SHORT, recorder, run_until
from tests.support.writing import seen_with_status as _seen
from tests.support.writing import writer

Body = dict[str, Any]


def _vmi(
    name: str, *, on: str = "n1", marked: str | None = "n1", strategy: str | None = "External", vm: bool = True
) -> Body:
    """A VMI our webhook admitted (labelled, naming its devices), running on `on`, marked off `marked`."""
    meta: Body = {
        "name": name,
        "namespace": "t1",
        "uid": f"u-{name}",
        "labels": {LABEL_DEVICE_REFERENCE: TRUE},
        "annotations": {ANNOTATION_DEVICES: "[]"},
    }
    if vm:
        meta["ownerReferences"] = [{"kind": "VirtualMachine", "name": name, "uid": f"vm-{name}", "controller": True}]
    status: Body = {"nodeName": on}
    if marked:
        status["evacuationNodeName"] = marked
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": meta,
        "spec": {"evictionStrategy": strategy} if strategy else {},
        "status": status,
    }


def _cloud(
    nodes: dict[str, int], *, per_node: int = 2, most: int = 5, stop_bare: bool = False
) -> tuple[Binder, View, MemKube]:
    w, view, kube = writer()
    for name, units in nodes.items():
        view.apply(kinds.NODE, node(name, {A10: units}))
    view.apply(kinds.GPU_CLASS, gpu_class("a10"))
    binder = Binder(
        view.cluster,
        w,
        incomplete_after=30,
        concurrency=8,
        events=recorder(kube),
        evacuations_per_node=per_node,
        evacuations=most,
        stop_bare=stop_bare,
    )
    view.subscribe(binder.changed)
    return binder, view, kube


def _running(view: View, kube: MemKube, vmi: Body, devices: list[tuple[str, int]], *, on: str = "n1") -> None:
    """The VMI in the API and the view, and its set (name, units) attached to it and Bound on `on`."""
    stored = kube.put(kinds.VMI, vmi)
    view.apply(kinds.VMI, stored)
    meta = stored["metadata"]
    attached = {"attachedTo": {"vmi": meta["name"], "uid": meta["uid"], "since": EPOCH.isoformat()}}
    for name, units in devices:
        _seen(view, kube, device(name, count=units, phase="Bound", node_name=on, status=dict(attached)))
    units = sum(n for _, n in devices)
    view.apply(kinds.POD, pod(f"launcher-{meta['name']}", {A10: units}, node=on, vmi=meta["name"], vmi_uid=meta["uid"]))


def _cordon(view: View, name: str, units: int = 8) -> None:
    view.apply(kinds.NODE, node(name, {A10: units}, unschedulable=True))


def _where(kube: MemKube, name: str) -> str | None:
    status = (kube.stored(kinds.GPU_DEVICE, name, "t1") or {}).get("status") or {}
    return status.get("nodeName") if status.get("phase") == "Bound" else None


def _gone(kube: MemKube, vmi: str) -> bool:
    return kube.stored(kinds.VMI, vmi, "t1") is None


def _events(kube: MemKube, reason: str) -> list[str]:
    return [e.get("message", "") for e in kube.stored_all(kinds.kind("Event")) if e.get("reason") == reason]


async def posted_messages(kube: MemKube, reason: str) -> list[str]:
    """The Events of `reason` once the recorder's posters have had their turn."""
    await asyncio.sleep(SHORT)
    return _events(kube, reason)


def test_a_marked_vm_restarts_on_a_node_reserved_for_its_whole_set_before_it_stops() -> None:
    """Its set moves to the fullest node that takes all of it while the VM still runs (the units held there), and
    only then is its VMI deleted under its uid for its VM to start the next; each device gets a `Moved` Event that
    says node maintenance, and the platform's log a line per step."""
    binder, view, kube = _cloud({"n1": 8, "n2": 8, "n3": 8})
    _running(view, kube, _vmi("vm"), [("a", 2), ("b", 2)])
    _seen(view, kube, device("other", count=4, phase="Bound", node_name="n3"))
    _cordon(view, "n1")
    with structlog.testing.capture_logs() as logged:
        assert asyncio.run(run_until(binder.run, lambda: _gone(kube, "vm")))
    assert (_where(kube, "a"), _where(kube, "b")) == ("n3", "n3")  # best fit: the fullest that takes the set
    writes = [
        (m, n)
        for m, k, n in kube.calls
        if (k, m) in {("GPUDevice", "replace_status"), ("VirtualMachineInstance", "delete")}
    ]
    assert writes[-1] == ("delete", "vm") and {n for _, n in writes[:-1]} == {"a", "b"}
    held = (kube.stored(kinds.GPU_DEVICE, "a", "t1") or {})["status"]["conditions"]
    assert any(c["reason"] == REASON_EVACUATING for c in held)
    assert len(_events(kube, "Moved")) == 2 and all("node maintenance" in m for m in _events(kube, "Moved"))
    steps = [(e["event"], e.get("to")) for e in logged if e["event"].startswith("vmi.")]
    assert steps == [("vmi.evacuating", "n3"), ("vmi.evacuated", "n3")]
    assert binder.evacuator.restarted == 1


def test_no_other_order_can_take_the_reserved_units() -> None:
    """While the VM restarts, the destination's units are its set's: a waiting device that would fit there only
    without them stays Pending (§6.8)."""
    binder, view, kube = _cloud({"n1": 8, "n2": 4})
    _running(view, kube, _vmi("vm"), [("a", 4)])
    _cordon(view, "n1")

    async def scenario() -> bool:
        restarted = await run_until(binder.run, lambda: _gone(kube, "vm"))
        _seen(view, kube, device("late", count=4))
        await run_until(binder.run, lambda: False, within=SHORT)
        return restarted

    assert asyncio.run(scenario())
    assert _where(kube, "a") == "n2" and _where(kube, "late") is None


def test_with_no_destination_the_vm_keeps_running_says_why_and_goes_when_room_appears() -> None:
    """No node takes the set: the VMI stays, each device gets an `EvacuationBlocked` Event (once) with the reason,
    the node's GPUNode says it blocks the drain; when room appears the evacuation goes, with no timer."""
    binder, view, kube = _cloud({"n1": 8, "n2": 8})
    _running(view, kube, _vmi("vm"), [("a", 4)])
    _seen(view, kube, device("full", count=6, phase="Bound", node_name="n2"))
    _cordon(view, "n1")

    async def scenario() -> bool:
        await run_until(binder.run, lambda: False, within=SHORT)
        assert not _gone(kube, "vm") and _where(kube, "a") == "n1"
        blocked = await posted_messages(kube, "EvacuationBlocked")
        assert len(blocked) == 1 and "no node has 4 free units" in blocked[0], blocked
        status = gpunode_status(view.cluster, "n1", [], EPOCH)
        assert status is not None
        condition = next(c for c in status.conditions if c.type == "Evacuation")
        assert condition.reason == "Blocked" and "t1/vm" in condition.message
        kube.remove(kinds.GPU_DEVICE, "full", "t1")
        view.forget(kinds.GPU_DEVICE, "t1", "full")
        return await run_until(binder.run, lambda: _gone(kube, "vm"))

    assert asyncio.run(scenario())
    assert _where(kube, "a") == "n2"


def test_a_vmi_without_the_external_strategy_is_left_to_kubevirt() -> None:
    """LiveMigrate (or none, with no cluster-wide External): KubeVirt's to handle; the operator touches nothing."""
    binder, view, kube = _cloud({"n1": 8, "n2": 8})
    _running(view, kube, _vmi("vm", strategy="LiveMigrate"), [("a", 2)])
    _cordon(view, "n1")
    asyncio.run(run_until(binder.run, lambda: False, within=SHORT))
    assert not _gone(kube, "vm") and _where(kube, "a") == "n1"


def test_the_cluster_wide_strategy_of_the_kubevirt_cr_counts_for_a_vmi_without_its_own() -> None:
    """A VMI with no evictionStrategy of its own follows the KubeVirt CR's `spec.configuration.evictionStrategy`."""
    binder, view, kube = _cloud({"n1": 8, "n2": 8})
    cr = {"metadata": {"name": "kubevirt", "namespace": "kubevirt", "resourceVersion": "5"}}
    view.apply(kinds.KUBEVIRT, {**cr, "spec": {"configuration": {"evictionStrategy": "External"}}})
    _running(view, kube, _vmi("vm", strategy=None), [("a", 2)])
    _cordon(view, "n1")
    assert asyncio.run(run_until(binder.run, lambda: _gone(kube, "vm")))
    assert _where(kube, "a") == "n2"


def test_a_tenants_own_mark_off_a_node_not_being_drained_moves_nothing() -> None:
    """virt-api drops a tenant's writes of a VMI's status (tests/adversarial/test_evacuation_marks.py); should its
    webhook be missing, a mark off a node not cordoned, or naming a node the set is not on, moves nothing and
    restarts nothing."""
    binder, view, kube = _cloud({"n1": 8, "n2": 8, "n3": 8})
    _running(view, kube, _vmi("vm", marked="n1"), [("a", 2)])
    _running(view, kube, _vmi("vm2", on="n2", marked="n3"), [("b", 2)], on="n2")
    _cordon(view, "n3")
    asyncio.run(run_until(binder.run, lambda: False, within=SHORT))
    assert not _gone(kube, "vm") and not _gone(kube, "vm2")
    assert (_where(kube, "a"), _where(kube, "b")) == ("n1", "n2")
    assert evacuation.marked(view.cluster) == []


def test_a_vmi_no_vm_controls_stays_unless_the_platform_says_to_stop_it() -> None:
    """A bare VMI would not come back: it blocks the drain, saying so; with stopBareVMIs it is stopped (deleted)
    and its devices stay where they are (idle, they leave as §6.8's idle devices do)."""
    binder, view, kube = _cloud({"n1": 8, "n2": 8})
    _running(view, kube, _vmi("bare", vm=False), [("a", 2)])
    _cordon(view, "n1")
    asyncio.run(run_until(binder.run, lambda: False, within=SHORT))
    assert not _gone(kube, "bare")
    assert any("no VirtualMachine" in m for m in _events(kube, "EvacuationBlocked"))
    binder, view, kube = _cloud({"n1": 8, "n2": 8}, stop_bare=True)
    _running(view, kube, _vmi("bare", vm=False), [("a", 2)])
    _cordon(view, "n1")
    assert asyncio.run(run_until(binder.run, lambda: _gone(kube, "bare")))
    assert _where(kube, "a") == "n1"  # not reserved anywhere: nothing restarts it


def test_evacuations_are_paced_per_node_the_first_marked_first() -> None:
    """Three VMs marked off n1 with at most two under way per node: the first two marked go; the third once one of
    them is gone (its VMI deleted and forgotten)."""
    binder, view, kube = _cloud({"n1": 8, "n2": 8, "n3": 8}, per_node=2)
    for name in ("v1", "v2", "v3"):
        _running(view, kube, _vmi(name), [(f"{name}-gpu", 2)])
    _cordon(view, "n1")

    async def scenario() -> bool:
        assert await run_until(binder.run, lambda: _gone(kube, "v1") and _gone(kube, "v2"))
        await run_until(binder.run, lambda: False, within=SHORT)
        assert not _gone(kube, "v3") and _where(kube, "v3-gpu") == "n1"
        view.forget(kinds.VMI, "t1", "v1")  # KubeVirt finished v1's deletion: the watch says so
        return await run_until(binder.run, lambda: _gone(kube, "v3"))

    assert asyncio.run(scenario())


def test_a_new_leader_restarts_a_vm_whose_set_was_reserved_without_moving_it_again() -> None:
    """The set waits on its destination (Placed reason Evacuating) and the VMI is still marked: a leader that took
    over after the last one's moves deletes the VMI and writes no device."""
    binder, view, kube = _cloud({"n1": 8, "n2": 8})
    vmi = _vmi("vm")
    stored = kube.put(kinds.VMI, vmi)
    view.apply(kinds.VMI, stored)
    placed = {"type": "Placed", "status": "True", "reason": REASON_EVACUATING, "lastTransitionTime": EPOCH.isoformat()}
    uid = stored["metadata"]["uid"]
    attached = {"attachedTo": {"vmi": "vm", "uid": uid, "since": EPOCH.isoformat()}, "conditions": [placed]}
    _seen(view, kube, device("a", count=2, phase="Bound", node_name="n2", status=attached))
    _cordon(view, "n1")
    assert asyncio.run(run_until(binder.run, lambda: _gone(kube, "vm")))
    assert kube.count("replace_status") == 0 and _where(kube, "a") == "n2"


def test_a_vmi_that_lingers_after_its_delete_frees_its_place_once_its_launcher_ends() -> None:
    """A tenant may add a finalizer of her own to her VMI, so it outlives the operator's delete: its evacuation is
    under way only until its launcher stops holding units, so it cannot hold a pacing place, and every drain behind
    it, for good."""
    binder, view, kube = _cloud({"n1": 8, "n2": 8, "n3": 8}, per_node=1, most=1)
    for name in ("v1", "v2"):
        _running(view, kube, _vmi(name), [(f"{name}-gpu", 2)])
    uid = view.cluster.vmis["t1", "v1"]
    _cordon(view, "n1")

    async def scenario() -> bool:
        assert await run_until(binder.run, lambda: _gone(kube, "v1"))
        await run_until(binder.run, lambda: False, within=SHORT)
        assert not _gone(kube, "v2") and kube.count("delete") == 1  # v1's VMI lingers (its finalizer): v2 waits
        view.apply(kinds.POD, pod("launcher-v1", {A10: 2}, node="n1", vmi="v1", vmi_uid=uid, phase="Succeeded"))
        return await run_until(binder.run, lambda: _gone(kube, "v2"))

    assert asyncio.run(scenario())


def test_a_guest_slow_to_stop_holds_its_own_nodes_place_not_the_clusters() -> None:
    """Tenant t1's evacuated guest ignores its shutdown for as long as her grace period says, so her launcher runs
    on after the delete. With one evacuation at a time in the cluster, tenant t2's VM on another drained node does
    not wait for it: its VMI is deleted too (before, t1 held the cluster's one place until her guest stopped)."""
    binder, view, kube = _cloud({"n1": 8, "n2": 8, "n3": 8, "n4": 8}, per_node=1, most=1)
    _running(view, kube, _vmi("v1"), [("v1-gpu", 2)])
    other = _vmi("v2", on="n3", marked="n3")
    other["metadata"]["namespace"] = "t2"
    stored = kube.put(kinds.VMI, other)
    view.apply(kinds.VMI, stored)
    uid = stored["metadata"]["uid"]
    attached = {"attachedTo": {"vmi": "v2", "uid": uid, "since": EPOCH.isoformat()}}
    theirs = device("v2-gpu", count=2, phase="Bound", node_name="n3", status=attached)
    theirs["metadata"]["namespace"] = "t2"
    _seen(view, kube, theirs)
    view.apply(kinds.POD, pod("launcher-v2", {A10: 2}, node="n3", vmi="v2", vmi_uid=uid, namespace="t2"))
    _cordon(view, "n1")

    async def scenario() -> bool:
        assert await run_until(binder.run, lambda: _gone(kube, "v1"))
        _cordon(view, "n3")  # the platform drains the next node while v1's guest is still stopping
        return await run_until(binder.run, lambda: kube.stored(kinds.VMI, "v2", "t2") is None)

    assert asyncio.run(scenario())


def test_each_vm_moved_off_a_cordoned_node_is_counted_on_its_gpunode() -> None:
    """Item 5: the node's GPUNode counts the VMs moved off it (`status.evacuated`), written as each goes, so the
    count outlives a change of leader; its Evacuation condition says it; uncordoned, the count goes."""
    binder, view, kube = _cloud({"n1": 8, "n2": 8})
    gpunode = {"apiVersion": "gpu.cozystack.io/v1alpha1", "kind": "GPUNode", "metadata": {"name": "n1"}}
    view.apply(kinds.GPU_NODE, kube.put(kinds.GPU_NODE, gpunode))
    _running(view, kube, _vmi("vm1"), [("a", 2)])
    _running(view, kube, _vmi("vm2"), [("b", 2)])
    _cordon(view, "n1")
    assert asyncio.run(run_until(binder.run, lambda: _gone(kube, "vm1") and _gone(kube, "vm2")))
    stored = kube.stored(kinds.GPU_NODE, "n1") or {}
    assert stored["status"]["evacuated"] == 2
    status = gpunode_status(view.cluster, "n1", [], EPOCH, evacuated=2)
    assert status is not None and status.evacuated == 2
    [condition] = [c for c in status.conditions if c.type == "Evacuation"]
    assert "2 VMs moved off the node" in (condition.message or "")
    view.apply(kinds.NODE, node("n1", {A10: 8}))  # uncordoned: the maintenance is over
    after = gpunode_status(view.cluster, "n1", [], EPOCH, evacuated=2)
    assert after is not None and after.evacuated is None


def test_the_reservation_lapses_after_the_grace_period_when_the_vm_does_not_come_back() -> None:
    """Item 1: the VM restarted for an evacuation but no next VMI came (its tenant broke it, or it stays down):
    the set's template device, reserved on the destination, is kept for the VM for the grace period and then
    deleted, its units free again (§6.6); the held device, the tenant's own, stays held there, detached."""
    binder, view, kube = _cloud({"n1": 8, "n2": 8})
    vmi = _vmi("vm")
    vmi["metadata"]["annotations"][ANNOTATION_DEVICES] = (
        '[{"device": "a"}, {"deviceTemplate": {"className": "a10", "count": 2}}]'
    )
    _running(view, kube, vmi, [("a", 2)])
    uid = (kube.stored(kinds.VMI, "vm", "t1") or {})["metadata"]["uid"]
    attached = {"attachedTo": {"vmi": "vm", "uid": uid, "since": EPOCH.isoformat()}}
    made = device("vm-gpu-1", count=2, phase="Bound", node_name="n1", template=True, status=attached)
    made["metadata"]["ownerReferences"] = [
        {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": "vm", "uid": "vm-vm"}
    ]
    _seen(view, kube, made)
    view.apply(kinds.POD, pod("launcher-vm", {A10: 4}, node="n1", vmi="vm", vmi_uid=uid))
    _cordon(view, "n1")
    assert asyncio.run(run_until(binder.run, lambda: _gone(kube, "vm")))
    assert (_where(kube, "a"), _where(kube, "vm-gpu-1")) == ("n2", "n2")
    # The watch's news: the VMI and its launcher are gone, and no next VMI comes.
    view.forget(kinds.VMI, "t1", "vm")
    view.apply(kinds.POD, pod("launcher-vm", {A10: 4}, node="n1", vmi="vm", vmi_uid=uid), deleted=True)
    grace = dt.timedelta(minutes=2)
    template = view.cluster.devices[("t1", "vm-gpu-1")]
    [keep] = device_actions(view.cluster, template, EPOCH, grace, vm_runs=True)
    assert keep.do is Do.KEEP
    kept = template.model_copy(update={"status": status_after(template, keep)})
    late = EPOCH + grace + dt.timedelta(seconds=1)
    assert [a.do for a in device_actions(view.cluster, kept, late, grace, vm_runs=True)] == [Do.DELETE]
    held = view.cluster.devices[("t1", "a")]
    assert [a.do for a in device_actions(view.cluster, held, EPOCH, grace)] == [Do.DETACH]
