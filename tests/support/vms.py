"""VirtualMachines as tenants write them, and what the KubeVirt tiers wait for on them and their devices."""

from __future__ import annotations

import json
from typing import Any

from cozygpu.api import kinds
from cozygpu.api.names import ANNOTATION_DEVICES, LABEL_DEVICE_REFERENCE
from cozygpu.kube.adapter import Body, Kube
from tests.support.harness import wait_for


def vm_body(
    name: str, namespace: str, refs: list[dict[str, Any]], *, running: bool = True, eviction: str | None = None
) -> Body:
    """A VM whose template names GPU devices (§1.5); KubeVirt copies both onto every VMI it makes. `eviction`: the
    template's evictionStrategy (External: the operator evacuates it off a node being drained, §6.8)."""
    body: Body = {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "runStrategy": "Always" if running else "Halted",
            "template": {
                "metadata": {
                    "labels": {LABEL_DEVICE_REFERENCE: "true", "kubevirt.io/vm": name},
                    "annotations": {ANNOTATION_DEVICES: json.dumps(refs)},
                },
                "spec": {
                    "domain": {"devices": {}, "resources": {"requests": {"memory": "128Mi"}}},
                    "terminationGracePeriodSeconds": 0,
                },
            },
        },
    }
    if eviction is not None:
        body["spec"]["template"]["spec"]["evictionStrategy"] = eviction
    return body


def held(name: str) -> dict[str, Any]:
    return {"device": name}


def template(class_name: str, count: int = 1) -> dict[str, Any]:
    return {"deviceTemplate": {"className": class_name, "count": count}}


def vmi(kube: Kube, namespace: str, name: str) -> Body | None:
    return kube.get_or_none(kinds.VMI, name, namespace)


def pods_of(kube: Kube, namespace: str, uid: str) -> list[Body]:
    """The pods virt-controller rendered for the VMI object with this uid."""
    return kube.list(kinds.POD, namespace, label_selector=f"kubevirt.io/created-by={uid}")


def running(
    kube: Kube, namespace: str, name: str, timeout: float = 60.0, *, not_uid: str | None = None
) -> tuple[Body, Body]:
    """Wait until the VM's VMI (another than `not_uid`, when given) runs; return it and its (one live) launcher pod."""

    def probe() -> tuple[Body, Body] | None:
        body = vmi(kube, namespace, name)
        if body is None or body.get("status", {}).get("phase") != "Running":
            return None
        if not_uid is not None and body["metadata"]["uid"] == not_uid:
            return None
        live = [
            p for p in pods_of(kube, namespace, body["metadata"]["uid"]) if not p["metadata"].get("deletionTimestamp")
        ]
        return (body, live[0]) if len(live) == 1 and live[0]["spec"].get("nodeName") else None

    return wait_for(f"VMI {namespace}/{name} running", probe, timeout)


def set_running(kube: Kube, namespace: str, name: str, run: bool) -> None:
    kube.patch(kinds.VM, name, {"spec": {"runStrategy": "Always" if run else "Halted"}}, namespace)


def gone(kube: Kube, namespace: str, name: str, uid: str, timeout: float = 60.0) -> None:
    """Wait until the VMI object with this uid and every pod rendered for it are gone."""

    def probe() -> bool:
        body = vmi(kube, namespace, name)
        return (body is None or body["metadata"]["uid"] != uid) and not pods_of(kube, namespace, uid)

    wait_for(f"VMI {namespace}/{name} ({uid}) gone", probe, timeout)


def bound(kv: Kube, ns: str, name: str) -> str:
    """Wait until the device is Bound; its node."""
    body = wait_for(
        f"GPUDevice {name} Bound",
        lambda: (d := kv.get(kinds.GPU_DEVICE, name, ns)).get("status", {}).get("phase") == "Bound" and d,
    )
    node: str = body["status"]["nodeName"]
    return node


def condition(vm: Body, kind: str) -> Body | None:
    return next((c for c in vm.get("status", {}).get("conditions") or [] if c.get("type") == kind), None)


def pin_of(spec: Body) -> list[str]:
    """Nodes named by matchFields pins in the spec's required node affinity."""
    terms = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
        or {}
    ).get("nodeSelectorTerms") or []
    return sorted(
        {v for t in terms for f in t.get("matchFields") or [] if f.get("key") == "metadata.name" for v in f["values"]}
    )


def gpu_units(pod: Body, resource: str) -> int:
    return sum(int((c.get("resources", {}).get("limits") or {}).get(resource, 0)) for c in pod["spec"]["containers"])


def drain(kube: Kube, node: str, timeout: float = 120.0) -> list[str]:
    """What `kubectl drain` does: cordon the node, then ask the Eviction API for every pod on it, again every moment
    while refused, until no pod is left. Returns the refusals seen (KubeVirt's, while a VM moves, §6.8)."""
    kube.patch(kinds.NODE, node, {"spec": {"unschedulable": True}})
    refusals: list[str] = []

    def empty() -> bool:
        pods = [p for p in kube.list(kinds.POD) if p["spec"].get("nodeName") == node]
        for pod in pods:
            said = kube.evict(pod["metadata"]["name"], pod["metadata"]["namespace"])
            if said not in ("evicted", "gone"):
                refusals.append(said)
        return not pods

    wait_for(f"node {node} drained", empty, timeout)
    return refusals
