"""The tests' own hands on the API server: read-change-replace, a held device waited until Bound, a device's status."""

from __future__ import annotations

from typing import Any

from cozygpu.api import kinds
from cozygpu.kube.adapter import Body, Conflict, Kube
from tests.support.bodies import gpu_device_body
from tests.support.harness import wait_for


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
