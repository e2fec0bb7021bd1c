"""Builders of cluster views for unit tests: plain API bodies into a `Cluster`."""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Sequence
from typing import Any

from cozygpu.api import kinds
from cozygpu.api.names import API_VERSION, LABEL_TEMPLATE_DEVICE
from cozygpu.runtime.view import View
from cozygpu.state.cluster import Cluster

A10 = "nvidia.com/GA102GL_A10"
L40S = "nvidia.com/NVIDIA_L40S-12Q"

_rv = itertools.count(1)
EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def rv() -> str:
    return str(next(_rv))


def node(
    name: str,
    gpus: dict[str, int],
    *,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    ready: bool = True,
    unschedulable: bool = False,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}, "resourceVersion": rv()},
        "spec": {"taints": taints or [], "unschedulable": unschedulable},
        "status": {
            "allocatable": {"cpu": "32", "memory": "64Gi", **{k: str(v) for k, v in gpus.items()}},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def gpu_class(
    name: str, resource: str = A10, mode: str = "passthrough", *, ready: bool | None = None, **spec: Any
) -> dict[str, Any]:
    """`ready`: the class's Ready condition (§12.3) for its generation, True or False; None: no condition."""
    body: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "GPUClass",
        "metadata": {"name": name, "resourceVersion": rv(), "generation": 1},
        "spec": {"mode": mode, "resourceName": resource, **spec},
    }
    if ready is not None:
        condition = {"type": "Ready", "status": "True" if ready else "False", "observedGeneration": 1}
        body["status"] = {"conditions": [condition]}
    return body


def device(
    name: str,
    class_name: str = "a10",
    count: int = 1,
    *,
    namespace: str = "t1",
    phase: str | None = None,
    node_name: str | None = None,
    template: bool = False,
    created: int = 0,
    status: dict[str, Any] | None = None,
    uid: str | None = None,
) -> dict[str, Any]:
    st: dict[str, Any] = dict(status or {})
    if phase:
        st["phase"] = phase
    if node_name:
        st["nodeName"] = node_name
    return {
        "apiVersion": API_VERSION,
        "kind": "GPUDevice",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{namespace}-{name}",  # one device per name unless a test makes another
            "resourceVersion": rv(),
            "creationTimestamp": (EPOCH + dt.timedelta(seconds=created)).isoformat(),
            "labels": {LABEL_TEMPLATE_DEVICE: "true"} if template else {},
        },
        "spec": {"className": class_name, "count": count},
        "status": st,
    }


def created(name: str, class_name: str = "a10", **kwargs: Any) -> dict[str, Any]:
    """`device`'s body as a create request carries it: no resourceVersion (the API server gives one)."""
    body = device(name, class_name, **kwargs)
    del body["metadata"]["resourceVersion"]
    return body


def budget(
    name: str, namespace: str = "t1", limits: dict[str, int] | None = None, total: int | None = None, **spec: Any
) -> dict[str, Any]:
    s: dict[str, Any] = {"limits": limits or {}, **spec}
    if total is not None:
        s["total"] = total
    return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": rv()}, "spec": s}


def cluster(
    *,
    nodes: Sequence[dict[str, Any]] = (),
    classes: Sequence[dict[str, Any]] = (),
    devices: Sequence[dict[str, Any]] = (),
    budgets: Sequence[dict[str, Any]] = (),
    namespaces: dict[str, dict[str, str]] | None = None,
) -> Cluster:
    c = Cluster()
    for n in nodes:
        View(c).apply(kinds.NODE, n)
    for cl in classes:
        View(c).apply(kinds.GPU_CLASS, cl)
    for d in devices:
        View(c).apply(kinds.GPU_DEVICE, d)
    for b in budgets:
        View(c).apply(kinds.GPU_BUDGET, b)
    for ns, labels in (namespaces or {}).items():
        View(c).apply(kinds.NAMESPACE, {"metadata": {"name": ns, "labels": labels}})
    return c


def request(
    request_id: str, vmi: str, devices: list[str], at: dt.datetime, result: str | None = None
) -> dict[str, Any]:
    r: dict[str, Any] = {"id": request_id, "vmi": vmi, "devices": devices, "requestedAt": at.isoformat()}
    if result:
        r["result"] = result
    return {"attachedTo": {"vmi": vmi, "since": at.isoformat()}, "bindRequest": r}


def pod(
    name: str = "p",
    asks: dict[str, int | str] | None = None,
    *,
    node: str | None = "n1",
    phase: str = "Running",
    namespace: str = "t1",
    vmi: str | None = None,
    init: dict[str, int | str] | None = None,
    version: int | None = None,
    vmi_uid: str = "u",
) -> dict[str, Any]:
    """A pod as a watch delivers it, asking for `asks` (default one A10) besides CPU and memory; with `vmi`,
    the launcher virt-controller renders for that VMI (its label, the VMI as controller)."""
    resources = {"cpu": "1", "memory": "1Gi", **{r: str(n) for r, n in ({A10: 1} if asks is None else asks).items()}}
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "resourceVersion": str(version or rv())}
    if vmi is not None:
        meta["labels"] = {"kubevirt.io": "virt-launcher"}
        owner = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": vmi, "uid": vmi_uid}
        meta["ownerReferences"] = [{**owner, "controller": True}]
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": resources, "limits": resources}}]}
    if init:
        spec["initContainers"] = [{"name": "i", "resources": {"limits": {r: str(n) for r, n in init.items()}}}]
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}
