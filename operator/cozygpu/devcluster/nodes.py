"""Fake GPU nodes made through the API: no kubelet, GPUs in `status.allocatable`.

Used by tests, the demo and benchmarks. The builders return bodies; `create_gpu_node`
and the setters write them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cozygpu.api import kinds
from cozygpu.kube.adapter import Body, Kube

BASE_RESOURCES = {"cpu": "32", "memory": "256Gi", "pods": "110"}

# What virt-handler and KubeVirt's device plugins put on a node that can run VMs (§11.1):
# every launcher pod selects on these labels and asks for one of each device.
KUBEVIRT_LABELS = {
    "kubevirt.io/schedulable": "true",
    "machine-type.node.kubevirt.io/q35": "true",
    "kubernetes.io/arch": "amd64",
}
KUBEVIRT_RESOURCES: dict[str, int | str] = {
    "devices.kubevirt.io/kvm": 1000,
    "devices.kubevirt.io/tun": 1000,
    "devices.kubevirt.io/vhost-net": 1000,
    "ephemeral-storage": "100Gi",
}

# The API server taints every new Node not-ready (TaintNodesByCondition); in a
# cluster the node lifecycle controller lifts it once the kubelet reports Ready.
NOT_READY_TAINT = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}


def node_body(
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
    unschedulable: bool = False,
) -> Body:
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = [dict(t) for t in taints]
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": spec,
    }


def node_status(gpus: Mapping[str, int | str], *, ready: bool = True) -> Body:
    resources = {**BASE_RESOURCES, **{k: str(v) for k, v in gpus.items()}}
    return {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": "KubeletReady" if ready else "KubeletNotReady",
                    "message": "fake node made by cozy-gpu-operator's dev tools",
                }
            ],
        }
    }


def create_gpu_node(
    kube: Kube,
    name: str,
    gpus: Mapping[str, int | str],
    *,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
    unschedulable: bool = False,
    ready: bool = True,
    kubevirt: bool = False,
) -> Body:
    """Create a Node, then write its status: the API server ignores status on create.

    `kubevirt`: labelled and equipped as virt-handler would leave a node, so launcher pods fit."""
    if kubevirt:
        labels = {**KUBEVIRT_LABELS, **(labels or {})}
        gpus = {**KUBEVIRT_RESOURCES, **gpus}
    kube.create(kinds.NODE, node_body(name, labels=labels, taints=taints, unschedulable=unschedulable))
    kube.patch(kinds.NODE, name, node_status(gpus, ready=ready), subresource="status")
    return _sync_not_ready_taint(kube, name, ready)


def _sync_not_ready_taint(kube: Kube, name: str, ready: bool) -> Body:
    """Do what the node lifecycle controller would: the not-ready taint follows Ready."""
    node = kube.get(kinds.NODE, name)
    taints = [t for t in node.get("spec", {}).get("taints") or [] if t["key"] != NOT_READY_TAINT["key"]]
    if not ready:
        taints.append(dict(NOT_READY_TAINT))
    node.setdefault("spec", {})["taints"] = taints or None
    return kube.replace(kinds.NODE, node)


def set_ready(kube: Kube, name: str, ready: bool) -> Body:
    node = kube.get(kinds.NODE, name)
    conditions = [c for c in node.get("status", {}).get("conditions", []) if c["type"] != "Ready"]
    ready_condition = node_status({}, ready=ready)["status"]["conditions"][0]
    kube.patch(kinds.NODE, name, {"status": {"conditions": [*conditions, ready_condition]}}, subresource="status")
    return _sync_not_ready_taint(kube, name, ready)


def set_gpus(kube: Kube, name: str, gpus: Mapping[str, int]) -> Body:
    """Set GPU allocatable (and capacity); a count of 0 removes the resource."""
    node = kube.get(kinds.NODE, name)
    status = node.get("status", {})
    patch: dict[str, Any] = {"capacity": {}, "allocatable": {}}
    for resource, count in gpus.items():
        value = str(count) if count else None
        for field in ("capacity", "allocatable"):
            if count or resource in status.get(field, {}):
                patch[field][resource] = value
    return kube.patch(kinds.NODE, name, {"status": patch}, subresource="status")
