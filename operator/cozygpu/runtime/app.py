"""The operator process: one cluster view, the binder and the node accountant.

`Operator` is what the kopf handlers (runtime.handlers) call: events go into the
cluster view and wake the executors; `startup` seeds the view with one list per
kind and only then reports ready. `handlers.run` starts kopf with it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
import structlog

from cozygpu.kube import credentials, kinds
from cozygpu.kube.adapter import AsyncKube, Kube
from cozygpu.runtime.accountant import Accountant
from cozygpu.runtime.binder import Binder
from cozygpu.runtime.health import HealthServer
from cozygpu.settings import Settings
from cozygpu.state.cluster import Cluster

log = structlog.get_logger("cozygpu.operator")

# Every kind the view holds, listed once at start-up and watched after.
WATCHED = ("GPUClass", "GPUDevice", "GPUBudget", "GPUNode", "Node", "Namespace")


class Operator:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        sync = Kube.from_kubeconfig(settings.kubeconfig) if settings.kubeconfig else Kube.in_cluster()
        self.kube = AsyncKube(sync)
        self.cluster = Cluster()
        self.accountant = Accountant(self.cluster, self.kube)
        self.binder = Binder(
            self.cluster,
            self.kube,
            incomplete_after=settings.bind_timeout,
            on_write=self.accountant.poke,
        )
        self.health = HealthServer(settings.health_host, settings.health_port, self.readiness)
        self.synced = False
        self._tasks: list[asyncio.Task[None]] = []

    # -- readiness ---------------------------------------------------------

    def readiness(self) -> tuple[bool, str]:
        if not self.synced:
            return False, "the cluster view has not synced yet"
        for task in self._tasks:
            if task.done():
                return False, f"{task.get_name()} stopped"
        return True, ""

    # -- events --------------------------------------------------------------

    def on_event(self, kind: str, event: dict[str, Any]) -> None:
        body = event.get("object") or {}
        meta = body.get("metadata", {})
        name, namespace = meta.get("name", ""), meta.get("namespace", "")
        deleted = event.get("type") == "DELETED"
        c = self.cluster
        match kind:
            case "GPUDevice":
                c.remove_device(namespace, name) if deleted else c.upsert_device(body)
            case "GPUClass":
                c.remove_class(name) if deleted else c.upsert_class(body)
            case "GPUBudget":
                c.remove_budget(namespace, name) if deleted else c.upsert_budget(body)
            case "GPUNode":
                c.remove_gpunode(name) if deleted else c.upsert_gpunode(body)
            case "Node":
                if deleted:
                    c.remove_node(name)
                    self.binder.node_removed(name)
                else:
                    c.upsert_node(body)
            case "Namespace":
                c.remove_namespace(name) if deleted else c.upsert_namespace(body)
        if self.synced:
            self.binder.poke()
            self.accountant.poke()

    # -- lifecycle -------------------------------------------------------------

    async def startup(self) -> None:
        await self.health.start()
        for kind in WATCHED:
            items = await asyncio.to_thread(self.kube.sync.list, kinds.kind(kind))
            for item in items:
                self.on_event(kind, {"type": None, "object": item})
        self.synced = True
        self._tasks = [
            asyncio.create_task(self.binder.run(), name="binder"),
            asyncio.create_task(self.accountant.run(), name="accountant"),
        ]
        log.info(
            "operator.synced",
            devices=len(self.cluster.devices),
            nodes=len(self.cluster.nodes),
            classes=len(self.cluster.classes),
            health_port=self.health.port,
        )

    async def cleanup(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.health.stop()
        log.info("operator.stopped")

    def login(self, kopf_kwargs: dict[str, Any]) -> kopf.ConnectionInfo:
        if self.settings.kubeconfig is None:
            info = kopf.login_with_service_account(**kopf_kwargs)
            if info is None:
                raise kopf.LoginError("no kubeconfig given and no in-cluster service account found")
            return info
        conn = credentials.from_kubeconfig(self.settings.kubeconfig)
        return kopf.ConnectionInfo(
            server=conn.server,
            ca_data=conn.ca_data,
            certificate_data=conn.certificate_data,
            private_key_data=conn.private_key_data,
            token=conn.token,
            insecure=conn.insecure,
            default_namespace=conn.namespace,
        )


def configure_kopf(settings: kopf.OperatorSettings) -> None:
    # We watch objects we do not own: no events posted about them, no progress stored.
    settings.posting.enabled = False
    settings.scanning.disabled = True
    settings.watching.server_timeout = 300
    settings.watching.reconnect_backoff = 0.5
    settings.queueing.batch_window = 0.01
    logging.getLogger("kopf").setLevel(logging.WARNING)
