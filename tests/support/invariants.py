"""The invariants every scenario checks, read from the API server (issue 12, §3-§7).

One checker for all scenarios: no node holds more than it has, no device given to two VMIs,
no attachment (claimed or not) to a VMI that does not exist, no template device without its VMI, no bind
request left unanswered, no budget exceeded (scenarios set their budgets before any order), no unit a
pod uses counted free on its node (§6.7: nor counted once for two launchers), and the operator ready.
Called once the operator has had a grace period and a sweep to clear what a crash left; `stale` alone
after every lifecycle scenario, `assert_invariants` after every hostile tenant's move.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict

from cozygpu.api import kinds, references
from cozygpu.api.names import gpu_entry_name, template_device_name
from cozygpu.kube.adapter import ApiError, Kube
from tests.support.harness import OperatorProcess, wait_for
from tests.support.soak import Record
from tests.support.tenants import Tenant


def guests(kube: Kube, namespace: str) -> set[str]:
    """The uids of VMIs whose guest still runs in a launcher pod that has not ended (§6.7), object or not."""
    return {
        o["uid"]
        for p in kube.list(kinds.POD, namespace)
        if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        for o in p["metadata"].get("ownerReferences") or []
        if o.get("kind") == "VirtualMachineInstance" and o.get("controller")
    }


def stale(kube: Kube, namespace: str) -> list[str]:
    """Attachments or requests without a live VMI, unanswered requests, template devices without their VMI. A VMI
    whose object is gone while its launcher pod still runs the guest is live (§6.7): its set stays."""
    vmis = {v["metadata"]["name"]: v["metadata"]["uid"] for v in kube.list(kinds.VMI, namespace)}
    running = guests(kube, namespace)
    found = []
    for d in kube.list(kinds.GPU_DEVICE, namespace):
        name, status = d["metadata"]["name"], d.get("status", {})
        attached = status.get("attachedTo")
        if attached and vmis.get(attached["vmi"]) != attached.get("uid") and attached.get("uid") not in running:
            found.append(f"{name}: attached to {attached['vmi']} which is not there")
        request = status.get("bindRequest")
        if request and not request.get("result"):
            found.append(f"{name}: unanswered request")
        if d["metadata"].get("labels", {}).get("gpu.cozystack.io/template-device") == "true":
            owners = [o["uid"] for o in d["metadata"].get("ownerReferences", [])]
            if not owners or (owners[0] not in vmis.values() and owners[0] not in running):
                found.append(f"{name}: template device without its VMI")
    return found


def over_allocated(kube: Kube) -> list[str]:
    """Nodes whose Bound devices hold more units of a resource than the node has."""
    classes = {c["metadata"]["name"]: c["spec"]["resourceName"] for c in kube.list(kinds.GPU_CLASS)}
    held: dict[tuple[str, str], int] = defaultdict(int)
    for d in kube.list(kinds.GPU_DEVICE):
        status = d.get("status") or {}
        resource = classes.get(d["spec"]["className"])
        if status.get("phase") == "Bound" and resource is not None:
            held[(status["nodeName"], resource)] += d["spec"].get("count", 1)
    allocatable = {n["metadata"]["name"]: n.get("status", {}).get("allocatable", {}) for n in kube.list(kinds.NODE)}
    return [
        f"node {node}: {units} of {resource} held, {allocatable.get(node, {}).get(resource, '0')} allocatable"
        for (node, resource), units in sorted(held.items())
        if node in allocatable and units > int(allocatable[node].get(resource, "0"))
    ]


def uncounted(kube: Kube) -> list[str]:
    """Nodes where running pods use more units of a GPU resource than the GPUNode counts as held or unmanaged
    (§6.7, §12): a unit a guest uses is never counted free, so never placed for a second guest or another
    tenant. A launcher whose VMI is gone (its finalizers stripped) still holds its units until its pod ends,
    and a second launcher of the same VMI name holds units of its own: each counts. Pods that ended, and pods
    on nodes that are gone, hold nothing."""
    resources = {c["spec"]["resourceName"] for c in kube.list(kinds.GPU_CLASS)}
    nodes = {n["metadata"]["name"] for n in kube.list(kinds.NODE)}
    used: dict[tuple[str, str], int] = defaultdict(int)
    for pod in kube.list(kinds.POD):
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        if node not in nodes or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for c in pod["spec"].get("containers") or []:
            for resource, units in ((c.get("resources") or {}).get("limits") or {}).items():
                if resource in resources:
                    used[(node, resource)] += int(units)
    counted = {
        (g["metadata"]["name"], r["name"]): r.get("held", 0) + r.get("unmanaged", 0)
        for g in kube.list(kinds.GPU_NODE)
        for r in (g.get("status") or {}).get("resources") or []
    }
    return [
        f"node {node}: pods use {units} units of {resource}, GPUNode counts {counted.get((node, resource), 0)}"
        for (node, resource), units in sorted(used.items())
        if units > counted.get((node, resource), 0)
    ]


def given_twice(kube: Kube, namespace: str) -> list[str]:
    """Devices two VMIs were given, and devices a VMI was given that are attached to another. A VMI was given
    the device of its entry i when it carries that entry's `gpus` (what our admission adds); one that went
    through no admission (a --dev operator's webhooks gone with it) carries none and was given nothing."""
    attached = {
        d["metadata"]["name"]: ((d.get("status") or {}).get("attachedTo") or {}).get("vmi")
        for d in kube.list(kinds.GPU_DEVICE, namespace)
    }
    given: dict[str, list[str]] = defaultdict(list)
    for vmi in kube.list(kinds.VMI, namespace):
        meta = vmi["metadata"]
        if meta.get("deletionTimestamp"):
            continue
        try:
            refs = references.parse(meta.get("annotations"), 10_000)
        except references.ReferenceError:
            continue
        gpus = ((vmi.get("spec") or {}).get("domain") or {}).get("devices", {}).get("gpus") or []
        entries = {g.get("name") for g in gpus if isinstance(g, dict)}
        for i, ref in enumerate(refs):
            if gpu_entry_name(i, 0) not in entries:
                continue
            device = ref.name if isinstance(ref, references.HeldRef) else template_device_name(meta["name"], i)
            given[device].append(meta["name"])
    found = [f"GPUDevice {d}: given to VMIs {', '.join(sorted(v))}" for d, v in sorted(given.items()) if len(v) > 1]
    found += [
        f"GPUDevice {d}: VMI {v[0]} was given it, attached to {attached.get(d)}"
        for d, v in sorted(given.items())
        if attached.get(d) != v[0]
    ]
    return found


def orphaned(kube: Kube, namespace: str) -> list[str]:
    """Unclaimed attachments (no uid) to a VMI that is not there: `stale` lets them be, as they are while an
    admission is under way, but past the grace period and a sweep none is left. (Claimed ones `stale` names.)"""
    vmis = {v["metadata"]["name"] for v in kube.list(kinds.VMI, namespace)}
    return [
        f"GPUDevice {d['metadata']['name']}: attached to {attached['vmi']}, which is not there"
        for d in kube.list(kinds.GPU_DEVICE, namespace)
        if (attached := (d.get("status") or {}).get("attachedTo"))
        and not attached.get("uid")
        and attached.get("vmi") not in vmis
    ]


def over_budget(kube: Kube, namespace: str) -> list[str]:
    """Budgets of the namespace (no selector) whose limits its devices, not being deleted, exceed."""
    used: dict[str, int] = defaultdict(int)
    for d in kube.list(kinds.GPU_DEVICE, namespace):
        if not d["metadata"].get("deletionTimestamp"):
            used[d["spec"]["className"]] += d["spec"].get("count", 1)
    found = []
    for b in kube.list(kinds.GPU_BUDGET, namespace):
        spec = b.get("spec") or {}
        for cls, limit in (spec.get("limits") or {}).items():
            if used.get(cls, 0) > limit:
                found.append(f"GPUBudget {b['metadata']['name']}: {used[cls]} units of {cls} in use, limit {limit}")
        if spec.get("total") is not None and sum(used.values()) > spec["total"]:
            found.append(f"GPUBudget {b['metadata']['name']}: {sum(used.values())} units in use, total {spec['total']}")
    return found


def violations(kube: Kube, namespace: str, operator: OperatorProcess | None = None) -> list[str]:
    """Every invariant broken now, in words; empty when all hold."""
    found = over_allocated(kube) + given_twice(kube, namespace) + stale(kube, namespace) + orphaned(kube, namespace)
    found += over_budget(kube, namespace) + uncounted(kube)
    if operator is not None and not operator.ready():
        found.append("the operator is not ready")
    return found


def admitting(kube: Kube, namespace: str, prefix: str, timeout: float = 5.0) -> bool:
    """Wait until an admission of a VMI named `prefix...` is under way (its template device made), so a fault
    lands in the middle of it; False if none showed within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ApiError):
            if any(d["metadata"]["name"].startswith(prefix) for d in kube.list(kinds.GPU_DEVICE, namespace)):
                return True
        time.sleep(0.01)
    return False


def settled(kube: Kube, namespace: str, operator: OperatorProcess, record: Record, when: str) -> None:
    """Wait for every invariant to hold; what still fails after the wait is recorded as a violation. A read the
    API server turns away for a moment (a cache re-initialising after a restart or a compaction) is read again."""

    def now() -> list[str]:
        try:
            return violations(kube, namespace, operator)
        except ApiError as e:
            return [f"the checker could not read: {e.message}"]

    try:
        wait_for(when, lambda: not now(), timeout=30)
    except AssertionError:
        record.violations += [f"{when}: {v}" for v in now()]


def assert_invariants(
    kube: Kube, tenants: tuple[Tenant, ...], operator: OperatorProcess | None = None, timeout: float = 20.0
) -> None:
    """The invariants (`violations`, for each tenant's namespace) hold once the operator has caught up. The wait
    is shorter than the grace period (120 s), so nothing an attack left is cleared by the collector before the
    check sees it."""

    def now() -> list[str]:
        return [f"{t.namespace}: {v}" for t in tenants for v in violations(kube, t.namespace, operator)]

    with contextlib.suppress(AssertionError):  # what still fails after the wait is named below
        wait_for("every invariant to hold", lambda: not now(), timeout=timeout)
    assert now() == []
