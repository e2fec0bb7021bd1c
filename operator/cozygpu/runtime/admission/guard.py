"""The no-bypass policy's parameter (§12.3): the managed GPU resources, published for the API server.

The ValidatingAdmissionPolicy (runtime.admission.policy) reads which resources are managed from one
ConfigMap in the operator's namespace, which this worker keeps equal to the resourceNames
of the view's GPUClasses: written when a class changes (`changed`), and made sure of every
interval, since anyone with rights in that namespace could delete it (the policy then guards
nothing until it is back: a missing parameter must never refuse every pod in the cluster).
Started by the Operator with the other workers.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import structlog

from cozygpu.api import kinds
from cozygpu.kube.adapter import ApiError, AsyncKube
from cozygpu.runtime.admission import policy
from cozygpu.state.cluster import Change, Cluster

log = structlog.get_logger("cozygpu.guard")

CONFIG_MAP = kinds.kind("ConfigMap")


class ManagedResources:
    def __init__(self, cluster: Cluster, kube: AsyncKube, namespace: str, *, interval: float) -> None:
        self._cluster = cluster
        self._kube = kube
        self._namespace = namespace
        self._interval = interval
        self._wake = asyncio.Event()
        self._written: dict[str, Any] | None = None

    def changed(self, change: Change) -> None:
        """A class came, went or changed its resource: the list may differ now."""
        self._wake.set()

    def wanted(self) -> dict[str, Any]:
        return policy.parameter(self._namespace, (c.spec.resource_name for c in self._cluster.classes.values()))

    async def run(self) -> None:
        while True:
            self._wake.clear()
            wanted = self.wanted()
            if wanted != self._written:
                try:
                    await self._kube.put_object(CONFIG_MAP, wanted)
                    self._written = wanted
                    log.info("guard.published", namespace=self._namespace, resources=wanted["data"])
                except ApiError as e:
                    log.warning("guard.write_failed", namespace=self._namespace, error=e.message)
            with contextlib.suppress(TimeoutError):  # not wait_for: on 3.11 it can swallow a cancel
                async with asyncio.timeout(self._interval):
                    await self._wake.wait()
                continue
            self._written = await self._current()  # the interval passed: look at what the API server has

    async def _current(self) -> dict[str, Any] | None:
        try:
            body = await self._kube.get_or_none(CONFIG_MAP, policy.MANAGED_RESOURCES, self._namespace)
        except ApiError as e:
            log.warning("guard.read_failed", namespace=self._namespace, error=e.message)
            return None
        if body is None:
            return None
        return policy.parameter(self._namespace, []) | {"data": body.get("data") or {}}
