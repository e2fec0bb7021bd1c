"""Kubernetes Events (§10): on GPUDevices Bound, Moved, Lost, Released, Failed; on VMs GPUsGathered.

Posting is best effort and never blocks a decision: Events wait in a bounded queue and
a few posters write them in the background, so they never compete with the binder's
and the webhook's writes for more than `POSTERS` of the client's connections (a burst of
binds posts as many Events as it writes devices). A failure is only logged; when the
queue is full the Event is dropped and counted. No namespace may hold more than a tenth of
the queue: one tenant's burst of failures drops its own Events, not everyone's (issue 34
item 6).
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
POSTERS = 2
QUEUED = 10_000
SHARE = QUEUED // 10  # the most Events of one namespace waiting at once
WARNINGS = frozenset({"Lost", "Failed", "EvacuationBlocked"})


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
    def __init__(self, kube: AsyncKube, *, posters: int = POSTERS, queued: int = QUEUED, share: int = SHARE) -> None:
        self._kube = kube
        self._posters = posters
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(queued)
        self._share = share
        self._waiting: dict[str, int] = {}  # Events queued per namespace
        self._workers: list[asyncio.Task[None]] = []
        self.dropped = 0

    def post(self, device: GPUDevice, reason: str, message: str) -> None:
        self.post_about(device_ref(device), reason, message)

    def post_about(self, involved: dict[str, Any], reason: str, message: str) -> None:
        """An Event on any object, by reference (a tenant's VirtualMachine, say)."""
        if not self._workers:  # started with the first Event, inside the running loop
            self._workers = [asyncio.create_task(self._poster()) for _ in range(self._posters)]
        namespace = str(involved.get("namespace") or "")
        try:
            if self._waiting.get(namespace, 0) >= self._share:
                raise asyncio.QueueFull
            self._queue.put_nowait(event_body(involved, reason, message))
            self._waiting[namespace] = self._waiting.get(namespace, 0) + 1
        except asyncio.QueueFull:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                name = involved.get("name")
                log.warning("event.dropped", reason=reason, namespace=namespace, name=name, dropped=self.dropped)

    async def _poster(self) -> None:
        while True:
            body = await self._queue.get()
            namespace = str(body["involvedObject"].get("namespace") or "")
            self._waiting[namespace] -= 1
            if not self._waiting[namespace]:
                del self._waiting[namespace]
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
            except Exception as e:  # the network: Events are best effort, the poster goes on
                log.warning("event.post_failed", reason=body["reason"], error=str(e) or type(e).__name__)

    async def close(self, grace: float = 2.0) -> None:
        """Post what is queued for up to `grace` seconds, then stop the posters."""
        if self._workers:
            try:
                async with asyncio.timeout(grace):
                    while not self._queue.empty():
                        await asyncio.sleep(0.05)
            except TimeoutError:
                log.warning("event.unposted", queued=self._queue.qsize())
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
