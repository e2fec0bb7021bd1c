"""The node accountant (§1.3, §8.3): keeps every GPUNode's status current.

Drains the nodes the cluster view marked dirty, computes their status with
`decisions.nodestatus` and writes only what changed: creating a GPUNode for a node
that starts serving a class, deleting it when nothing is left to say.
"""

from __future__ import annotations

import asyncio

import structlog

from cozygpu.api import GPUNode
from cozygpu.api.meta import now as utcnow
from cozygpu.api.names import API_VERSION
from cozygpu.decisions.nodestatus import gpunode_status
from cozygpu.kube import kinds
from cozygpu.kube.adapter import AlreadyExists, ApiError, AsyncKube, Conflict, NotFound
from cozygpu.state.cluster import Cluster

log = structlog.get_logger("cozygpu.accountant")


def _comparable(node: GPUNode) -> dict[str, object]:
    return node.status.model_dump(mode="json", exclude_none=True)


class Accountant:
    def __init__(self, cluster: Cluster, kube: AsyncKube) -> None:
        self._cluster = cluster
        self._kube = kube
        self._wake = asyncio.Event()
        self._retry: set[str] = set()

    def poke(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        self._cluster.dirty_nodes |= set(self._cluster.nodes) | set(self._cluster.gpunodes)
        while True:
            self._wake.clear()
            dirty, self._cluster.dirty_nodes = self._cluster.dirty_nodes | self._retry, set()
            self._retry = set()
            for name in sorted(dirty):
                try:
                    await self._sync(name)
                except ApiError as e:
                    log.warning("gpunode.write_failed", node=name, error=e.message)
                    self._retry.add(name)
            if self._retry:
                await asyncio.sleep(1.0)
                continue
            await self._wake.wait()

    async def _sync(self, name: str) -> None:
        existing = self._cluster.gpunodes.get(name)
        status = gpunode_status(self._cluster, name, existing.status.conditions if existing else [], utcnow())
        if status is None:
            if existing is not None:
                await self._kube.delete(kinds.GPU_NODE, name, uid=existing.metadata.uid)
                self._cluster.remove_gpunode(name)
                log.info("gpunode.deleted", node=name)
            return
        if existing is None:
            try:
                body = await self._kube.create(
                    kinds.GPU_NODE, {"apiVersion": API_VERSION, "kind": "GPUNode", "metadata": {"name": name}}
                )
            except AlreadyExists:
                body = await self._kube.get(kinds.GPU_NODE, name)
            self._cluster.upsert_gpunode(body)
            existing = GPUNode.from_wire(body)
            log.info("gpunode.created", node=name)
        wanted = existing.model_copy(update={"status": status})
        if _comparable(wanted) == _comparable(existing):
            return
        try:
            body = await self._kube.replace_status(kinds.GPU_NODE, wanted.wire())
        except (Conflict, NotFound):
            fresh = await self._kube.get_or_none(kinds.GPU_NODE, name)
            if fresh is None:
                self._cluster.remove_gpunode(name)
            else:
                self._cluster.upsert_gpunode(fresh)
            self._retry.add(name)
            return
        self._cluster.upsert_gpunode(body)
        log.info("gpunode.updated", node=name, summary=status.summary)
