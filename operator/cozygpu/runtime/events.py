"""Kubernetes Events on GPUDevices (§10): Bound, Moved, Lost, Released, Failed.

Posting is best effort and never blocks a decision: each Event is written in the
background, and a failure is only logged.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from cozygpu.api import GPUDevice
from cozygpu.api.meta import now
from cozygpu.api.names import API_VERSION
from cozygpu.kube import kinds
from cozygpu.kube.adapter import ApiError, AsyncKube

log = structlog.get_logger("cozygpu.events")

COMPONENT = "cozy-gpu-operator"
WARNINGS = frozenset({"Lost", "Failed"})


def event_body(device: GPUDevice, reason: str, message: str) -> dict[str, Any]:
    stamp = now().isoformat().replace("+00:00", "Z")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{device.name}.", "namespace": device.namespace},
        "involvedObject": {
            "apiVersion": API_VERSION,
            "kind": "GPUDevice",
            "name": device.name,
            "namespace": device.namespace,
            "uid": device.metadata.uid,
            "resourceVersion": device.metadata.resource_version,
        },
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
        task = asyncio.create_task(self._post(event_body(device, reason, message)))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _post(self, body: dict[str, Any]) -> None:
        try:
            await self._kube.create(kinds.kind("Event"), body)
        except ApiError as e:
            log.warning(
                "event.post_failed", reason=body["reason"], device=body["involvedObject"]["name"], error=e.message
            )
