"""The operator process: one cluster view, the binder, the node accountant, the webhooks.

`Operator` is what the kopf handlers (runtime.handlers) call: events go into the
cluster view and wake the executors; `startup` seeds the view with one list per
kind, learns its own identity, registers webhooks in dev mode, and only then
reports ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import signal
import socket
import time
from collections.abc import Iterator
from typing import Any

import kopf
import structlog

from cozygpu.kube import credentials, kinds
from cozygpu.kube.adapter import ApiError, AsyncKube, Kube
from cozygpu.runtime import leadership, policy, webhooks
from cozygpu.runtime.accountant import Accountant
from cozygpu.runtime.binder import Binder
from cozygpu.runtime.collector import Collector
from cozygpu.runtime.events import Recorder
from cozygpu.runtime.health import HealthServer
from cozygpu.runtime.metrics import Metrics
from cozygpu.runtime.pod_webhook import LauncherAdmission, PodRefused
from cozygpu.runtime.reservations import Reservations
from cozygpu.runtime.validation import Denied, Validation
from cozygpu.runtime.vmi_webhook import InternalError, Refusal, VMIAdmission
from cozygpu.runtime.waiters import Waiters
from cozygpu.settings import Settings
from cozygpu.state.cluster import KINDS, Cluster

log = structlog.get_logger("cozygpu.operator")

# Every kind the view holds: listed at start-up and on each resync, watched in between.
WATCHED = KINDS
# The first resync closes the start-up race between our list and the watch's own.
FIRST_RESYNC = 5.0
RESYNC_PAGE = 500


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class Operator:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        connections = settings.api_concurrency
        sync = (
            Kube.from_kubeconfig(settings.kubeconfig, connections=connections)
            if settings.kubeconfig
            else Kube.in_cluster(connections=connections)
        )
        self.kube = AsyncKube(sync, workers=connections)
        self.cluster = Cluster()
        self.metrics = Metrics(self.cluster)
        self.waiters = Waiters()
        self.reservations = Reservations(ttl=settings.webhook_timeout + 10)
        self.events = Recorder(self.kube)
        self.accountant = Accountant(self.cluster, self.kube)
        self.binder = Binder(
            self.cluster,
            self.kube,
            incomplete_after=settings.bind_timeout,
            on_write=self._written,
            reserved=self.reservations.orders,
            events=self.events,
            metrics=self.metrics,
        )
        self.collector = Collector(
            self.cluster,
            self.kube,
            self.events,
            grace=settings.grace_period,
            sweep_interval=settings.sweep_interval,
            on_write=self._written,
        )
        self.vmis = VMIAdmission(
            self.cluster,
            self.kube,
            self.waiters,
            self.reservations,
            bind_timeout=settings.bind_timeout,
            seen=self._seen,
            events=self.events,
        )
        self.validation = Validation(self.cluster, self.reservations)
        self.launchers = LauncherAdmission(self.cluster, settings.kubevirt_controller_user)
        self.health = HealthServer(settings.health_host, settings.health_port, self.readiness, self.metrics.render)
        self.serving: webhooks.Serving | None = None
        self.leadership = leadership.for_settings(settings, self.kube, on_lost=self._lost)
        self._not_leading = "not the leader yet"
        self.synced = False
        self.webhooks_ready = settings.webhook_mode == "off"
        self._tasks: list[asyncio.Task[None]] = []

    # -- readiness ---------------------------------------------------------

    def readiness(self) -> tuple[bool, str]:
        if self.leadership is not None and not self.leadership.leading:
            return False, self._not_leading
        if not self.synced:
            return False, "the cluster view has not synced yet"
        if not self.webhooks_ready:
            return False, "the admission webhooks are not serving yet"
        for task in self._tasks:
            if task.done():
                return False, f"{task.get_name()} stopped"
        return True, ""

    # -- events --------------------------------------------------------------

    def on_event(self, kind: str, event: dict[str, Any]) -> None:
        body = event.get("object") or {}
        meta = body.get("metadata", {})
        name, namespace = meta.get("name", ""), meta.get("namespace", "")
        rv = meta.get("resourceVersion")  # a removal's version keeps late echoes of our writes out
        deleted = event.get("type") == "DELETED"
        c = self.cluster
        match kind:
            case "GPUDevice":
                if deleted:
                    c.remove_device(namespace, name, rv)
                else:
                    c.upsert_device(body)
                    self.reservations.seen(namespace, name)
                    self.collector.touch_device(namespace, name)
                    self.binder.touch(namespace, name)
            case "GPUClass":
                c.remove_class(name, rv) if deleted else c.upsert_class(body)
                self.collector.touch_class(name)
            case "VirtualMachineInstance":
                c.remove_vmi(namespace, name, rv) if deleted else c.upsert_vmi(body)
                self.collector.touch_vmi(namespace, name)
            case "GPUBudget":
                c.remove_budget(namespace, name, rv) if deleted else c.upsert_budget(body)
            case "GPUNode":
                c.remove_gpunode(name, rv) if deleted else c.upsert_gpunode(body)
            case "Node":
                c.remove_node(name, rv) if deleted else c.upsert_node(body)
            case "Namespace":
                c.remove_namespace(name, rv) if deleted else c.upsert_namespace(body)
            case "KubeVirt":
                c.remove_kubevirt(namespace, name, rv) if deleted else c.upsert_kubevirt(body)
        if self.synced:
            self.binder.poke()
            self.accountant.poke()
            self.waiters.notify()

    def _written(self) -> None:
        self.accountant.poke()
        self.waiters.notify()

    def _seen(self, body: dict[str, Any]) -> None:
        """A device the webhook wrote: into the view at once, and the binder woken."""
        self.cluster.upsert_device(body)
        meta = body.get("metadata", {})
        self.binder.touch(meta.get("namespace", ""), meta.get("name", ""))
        self.waiters.notify()

    # -- admission -------------------------------------------------------------

    @contextlib.contextmanager
    def _timed(self, webhook: str) -> Iterator[None]:
        """Observe the admission's latency by outcome: allowed, denied (403) or error."""
        started, result = time.monotonic(), "allowed"
        try:
            yield
        except kopf.AdmissionError as e:
            result = "denied" if e.code == 403 else "error"
            raise
        except Exception:
            result = "error"
            raise
        finally:
            self.metrics.admission.labels(webhook, result).observe(time.monotonic() - started)

    async def mutate_vmi(self, body: dict[str, Any], patch: kopf.Patch, dry_run: bool) -> None:
        with self._timed(webhooks.VMI_HOOK):
            try:
                admitted = await self.vmis.admit(body, dry_run)
            except Refusal as e:
                raise kopf.AdmissionError(str(e), code=403) from None
            except InternalError as e:
                raise kopf.AdmissionError(f"the GPU operator could not check the VMI: {e}", code=500) from None
        if admitted is not body:
            patch.fns.append(lambda target: _replace(target, admitted))

    def mutate_pod(self, body: dict[str, Any], patch: kopf.Patch, user: str) -> None:
        with self._timed(webhooks.POD_HOOK):
            if not self.synced:
                # Decided from the view alone: none yet, so fail closed and let KubeVirt retry.
                raise kopf.AdmissionError("the GPU operator has not synced its view yet", code=500)
            try:
                admitted = self.launchers.admit(body, user)
            except PodRefused as e:
                raise kopf.AdmissionError(str(e), code=403) from None
        if admitted is not body:
            patch.fns.append(lambda target: _replace(target, admitted))

    async def validate_device(
        self, operation: str, new: dict[str, Any] | None, old: dict[str, Any] | None, user: str, dry_run: bool
    ) -> None:
        with self._timed(webhooks.DEVICE_HOOK):
            try:
                await self.validation.device(operation, new, old, user, dry_run)
            except Denied as e:
                raise kopf.AdmissionError(str(e), code=403) from None

    def validate_class(self, operation: str, new: dict[str, Any] | None, old: dict[str, Any] | None) -> None:
        with self._timed(webhooks.CLASS_HOOK):
            try:
                self.validation.gpu_class(operation, new, old)
            except Denied as e:
                raise kopf.AdmissionError(str(e), code=403) from None

    def validate_budget(self, new: dict[str, Any] | None, warnings: list[str]) -> None:
        with self._timed(webhooks.BUDGET_HOOK):
            try:
                self.validation.budget(new, warnings)
            except Denied as e:
                raise kopf.AdmissionError(str(e), code=403) from None

    # -- lifecycle -------------------------------------------------------------

    def configure(self, settings: kopf.OperatorSettings) -> None:
        # We watch objects we do not own: no events posted about them, no progress stored.
        settings.posting.enabled = False
        settings.scanning.disabled = True
        settings.watching.server_timeout = 300
        settings.watching.reconnect_backoff = 0.5
        settings.queueing.batch_window = 0.01
        logging.getLogger("kopf").setLevel(logging.WARNING)
        mode = self.settings.webhook_mode
        if mode == "dev":
            host = "127.0.0.1"
            port = self.settings.webhook_port or _free_port(host)
            self.serving = webhooks.dev_serving(host, port)
            settings.admission.server = self.serving.server
        elif mode == "cluster":
            settings.admission.server = webhooks.cluster_serving(
                self.settings.webhook_host, self.settings.webhook_port or 9443, self.settings.webhook_cert_dir
            )

    async def startup(self) -> None:
        await self.health.start()
        if self.leadership is not None:  # a standby lists and decides nothing (§10: one active replica)
            await self.leadership.acquire(self._waiting)
        await self.resync()
        self.validation.operator_user = await self.kube.whoami()
        self.synced = True
        self._tasks = [
            asyncio.create_task(self.accountant.run(), name="accountant"),
            asyncio.create_task(self.collector.run(), name="collector"),
            asyncio.create_task(self._resync_every(self.settings.sweep_interval), name="resync"),
        ]
        if self.leadership is not None:
            self._tasks.append(asyncio.create_task(self.leadership.hold(), name="leadership"))
        if self.settings.binder:
            self._tasks.append(asyncio.create_task(self.binder.run(), name="binder"))
        if self.settings.webhook_mode != "off":
            self._tasks.append(asyncio.create_task(self._serve_webhooks(), name="webhooks"))
        log.info(
            "operator.synced",
            devices=len(self.cluster.devices),
            nodes=len(self.cluster.nodes),
            classes=len(self.cluster.classes),
            identity=self.validation.operator_user,
            health_port=self.health.port,
        )

    async def resync(self) -> int:
        """List every kind and make the view agree (§6.4); returns how many objects it had lost track of.

        Listed objects go in as events (older versions are ignored); what the view holds at a version
        no newer than the list but the list lacks was removed where no watch event said so, and is
        removed here the way a DELETED event would remove it (a VMI's devices are detached, say)."""
        forgotten, started, skipped = 0, time.monotonic(), 0
        for kind in WATCHED:
            listed: set[Any] = set()
            version, after = "", ""
            while True:
                # Pages, and the event loop's turn between them: a resync of 50,000 devices must not hold up
                # admissions (§13.3), nor hold every object of a kind in memory at once.
                items, version, after = await self.kube.list_page(kinds.kind(kind), RESYNC_PAGE, after)
                for item in items:
                    key = _key(kind, item)
                    listed.add(key)
                    if self.cluster.holds(kind, key, item.get("metadata", {}).get("resourceVersion")):
                        skipped += 1  # what the view has at this very version needs no second reading
                        continue
                    self.on_event(kind, {"type": None, "object": item})
                await asyncio.sleep(0)
                if not after:
                    break
            for key in self.cluster.missing(kind, listed, version):
                namespace, name = key if isinstance(key, tuple) else ("", key)
                gone = {"metadata": {"name": name, "namespace": namespace, "resourceVersion": version}}
                self.on_event(kind, {"type": "DELETED", "object": gone})
                log.info("view.forgot", kind=kind, namespace=namespace or None, name=name)
                forgotten += 1
        log.info("view.resynced", forgotten=forgotten, unchanged=skipped,
                 duration_ms=round((time.monotonic() - started) * 1000, 1))  # fmt: skip
        return forgotten

    async def _resync_every(self, interval: float) -> None:
        await asyncio.sleep(min(FIRST_RESYNC, interval))
        while True:
            try:
                await self.resync()
            except ApiError as e:
                log.warning("view.resync_failed", error=e.message)
            await asyncio.sleep(interval)

    async def _serve_webhooks(self) -> None:
        """Wait until kopf's server accepts connections, register (dev), then report ready."""
        host, port = (
            ("127.0.0.1", self.serving.server.port)
            if self.serving is not None
            else ("127.0.0.1", self.settings.webhook_port or 9443)
        )
        while True:
            try:
                _, writer = await asyncio.open_connection(host, port)
                writer.close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        if self.serving is not None:
            for config in webhooks.configurations(
                self.serving.url, self.serving.ca_bundle, self.settings.webhook_timeout, self.validation.operator_user
            ):
                kind = kinds.MUTATING_WEBHOOKS if config["kind"].startswith("Mutating") else kinds.VALIDATING_WEBHOOKS
                await self.kube.put_object(kind, config)
            await self.kube.put_object(kinds.POLICY, policy.policy(self.settings.kubevirt_controller_user))
            await self.kube.put_object(kinds.POLICY_BINDING, policy.binding())
            log.info("webhooks.registered", url=self.serving.url, policy=policy.NAME)
        self.webhooks_ready = True
        await asyncio.Event().wait()  # keeps readiness honest: a stopped task turns it off

    def _waiting(self, why: str) -> None:
        if why != self._not_leading:
            log.info("leader.waiting", reason=why)
        self._not_leading = why

    def _lost(self) -> None:
        """Another replica may be deciding now: stop every writer at once, then the process."""
        for task in self._tasks:
            if task.get_name() != "leadership":
                task.cancel()
        self._not_leading = "the Lease was lost"
        signal.raise_signal(signal.SIGTERM)

    async def cleanup(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.leadership is not None:
            await self.leadership.release()
        if self.serving is not None:
            registered = ((kinds.MUTATING_WEBHOOKS, webhooks.CONFIGURATION_NAME),
                          (kinds.VALIDATING_WEBHOOKS, webhooks.CONFIGURATION_NAME),
                          (kinds.POLICY_BINDING, policy.NAME), (kinds.POLICY, policy.NAME))  # fmt: skip
            for kind, name in registered:
                try:
                    await self.kube.delete(kind, name)
                except ApiError as e:
                    log.warning("webhooks.unregister_failed", error=e.message)
            log.info("webhooks.unregistered")
        await self.health.stop()
        self.kube.close()
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


def _key(kind: str, body: dict[str, Any]) -> Any:
    meta = body.get("metadata", {})
    namespaced = kinds.kind(kind).namespaced
    return (meta.get("namespace", ""), meta.get("name", "")) if namespaced else meta.get("name", "")


def _replace(target: Any, admitted: dict[str, Any]) -> None:
    target.clear()
    target.update(copy.deepcopy(admitted))
