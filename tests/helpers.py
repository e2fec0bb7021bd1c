"""Body builders and small helpers shared by the tests."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from cozygpu.api import kinds
from cozygpu.api.names import LABEL_TEMPLATE_DEVICE
from cozygpu.devcluster.bodies import vmi_body
from cozygpu.devcluster.harness import wait_for
from cozygpu.kube.adapter import ApiError, Body, Conflict, Kube

A10 = "nvidia.com/GA102GL_A10"


def gpu_class_body(name: str, resource: str = A10, mode: str = "passthrough", **spec: Any) -> Body:
    return {
        "apiVersion": "gpu.cozystack.io/v1alpha1",
        "kind": "GPUClass",
        "metadata": {"name": name},
        "spec": {"mode": mode, "resourceName": resource, **spec},
    }


def gpu_device_body(name: str, namespace: str, class_name: str, count: int = 1) -> Body:
    return {
        "apiVersion": "gpu.cozystack.io/v1alpha1",
        "kind": "GPUDevice",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"className": class_name, "count": count},
    }


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def leftovers(kube: Kube, namespace: str, vmi: str) -> list[str]:
    """What a refused admission of `vmi` may not leave behind: attachments, requests, template devices."""
    found = []
    for d in kube.list(kinds.GPU_DEVICE, namespace):
        name, status = d["metadata"]["name"], d.get("status", {})
        if (status.get("attachedTo") or {}).get("vmi") == vmi:
            found.append(f"{name}: attached")
        if (status.get("bindRequest") or {}).get("vmi") == vmi:
            found.append(f"{name}: bind request")
        if name.startswith(f"{vmi}-gpu-") and d["metadata"].get("labels", {}).get(LABEL_TEMPLATE_DEVICE) == "true":
            found.append(f"{name}: template device")
    return found


def update(kube: Kube, kind: kinds.Kind, name: str, change: Any, namespace: str | None = None) -> Body:
    """Read, change, replace; again on a conflict (the operator writes our objects too)."""
    for _ in range(10):
        body = kube.get(kind, name, namespace)
        change(body)
        try:
            return kube.replace(kind, body)
        except Conflict:
            continue
    raise AssertionError(f"{kind.kind} {name} kept changing")


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


def refused(kube: Kube, body: dict[str, Any]) -> str:
    """Create the VMI, expecting our webhook's denial; return its message. No VMI is stored."""
    with pytest.raises(ApiError) as raised:
        kube.create(kinds.VMI, body)
    assert raised.value.status == 403, raised.value.message
    assert 'admission webhook "vmi.gpu.cozystack.io" denied the request' in raised.value.message
    assert kube.get_or_none(kinds.VMI, body["metadata"]["name"], body["metadata"]["namespace"]) is None
    return raised.value.message


def dry_denial(kube: Kube, namespace: str, refs: list[dict[str, Any]]) -> str:
    """The denial a dry run gets now, or "" when it would be admitted; for waiting on the operator's view."""
    try:
        kube.create(kinds.VMI, vmi_body(unique("probe"), namespace, refs), dry_run=True)
    except ApiError as e:
        return e.message
    return ""


def device_status(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = kube.get(kinds.GPU_DEVICE, name, namespace).get("status", {})
    return result


def held(kube: Kube, namespace: str, name: str, cls: str, count: int = 1) -> Body:
    """A held device, waited for until the binder has it Bound."""
    kube.create(kinds.GPU_DEVICE, gpu_device_body(name, namespace, cls, count))
    return wait_for(
        f"{name} bound",
        lambda: (d := kube.get(kinds.GPU_DEVICE, name, namespace)).get("status", {}).get("phase") == "Bound" and d,
    )
