"""Body builders and small helpers shared by the tests."""

from __future__ import annotations

import uuid
from typing import Any

from cozygpu.kube.adapter import Body

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
