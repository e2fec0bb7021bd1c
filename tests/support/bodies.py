"""Objects as tenants and the platform write them, for tests that create them through the real API server."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from cozygpu.api.names import API_VERSION
from cozygpu.devcluster.bodies import vmi_body
from cozygpu.kube.adapter import Body

__all__ = ["A10", "budget_body", "gpu_class_body", "gpu_device_body", "unique", "vmi_body"]

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


def budget_body(
    namespace: str,
    name: str = "cap",
    *,
    total: int | None = None,
    limits: Mapping[str, int] | None = None,
    selector: Mapping[str, str] | None = None,
) -> Body:
    """A GPUBudget as the platform sets it (tenants may only read budgets)."""
    spec: dict[str, Any] = {"limits": dict(limits or {})}
    if total is not None:
        spec["total"] = total
    if selector is not None:
        spec["namespaceSelector"] = {"matchLabels": dict(selector)}
    return {
        "apiVersion": API_VERSION,
        "kind": "GPUBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"
