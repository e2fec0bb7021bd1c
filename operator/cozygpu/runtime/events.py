"""Kubernetes Events (§10): on GPUDevices Bound, Moved, Lost, Released, Failed; on VMs GPUsGathered.

Posting is best effort and never blocks a decision: each Event is written in the
background, and a failure is only logged.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from cozygpu.api import GPUDevice, kinds
from cozygpu.api.meta import now
from cozygpu.api.names import API_VERSION
from cozygpu.kube.adapter import ApiError, AsyncKube

log = structlog.get_logger("cozygpu.events")

COMPONENT = "cozy-gpu-operator"
WARNINGS = frozenset({"Lost", "Failed"})


def device_ref(device: GPUDevice) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "GPUDevice",
        "name": device.name,
        "namespace": device.namespace,
        "uid": device.metadata.uid,
        "resourceVersion": device.metadata.resource_version,
    }


def event_body(involved: dict[str, Any], reason: str, message: str) -> dict[str, Any]:
    """An Event about `involved` (an object reference: apiVersion, kind, name, namespace, uid)."""
    stamp = now().isoformat().replace("+00:00", "Z")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{involved['name']}.", "namespace": involved["namespace"]},
        "involvedObject": involved,
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if reason in WARNINGS else "Normal",
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": COMPONENT,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class Recorder:
    def __init__(self, kube: AsyncKube) -> None:
        self._kube = kube
        self._pending: set[asyncio.Task[None]] = set()

    def post(self, device: GPUDevice, reason: str, message: str) -> None:
        self.post_about(device_ref(device), reason, message)

    def post_about(self, involved: dict[str, Any], reason: str, message: str) -> None:
        """An Event on any object, by reference (a tenant's VirtualMachine, say)."""
        task = asyncio.create_task(self._post(event_body(involved, reason, message)))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _post(self, body: dict[str, Any]) -> None:
        try:
            await self._kube.create(kinds.kind("Event"), body)
        except ApiError as e:
            involved = body["involvedObject"]
            log.warning(
                "event.post_failed",
                reason=body["reason"],
                kind=involved["kind"],
                name=involved["name"],
                error=e.message,
            )
