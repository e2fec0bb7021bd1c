"""The collector (§6): attachments, ownership, finalizers and garbage, kept right.

Event-driven: the Operator marks the devices a VMI, device or class event touches and
the collector applies `decisions.lifecycle` to them at once. Time-driven where the
design is: it wakes when the earliest grace period runs out. And a full sweep every
sweep interval catches whatever a restart or a watch gap hid (§6.4).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import Callable

import structlog

from cozygpu.api import GPUClass, GPUDevice
from cozygpu.api.meta import OwnerReference
from cozygpu.api.meta import now as utcnow
from cozygpu.api.names import FINALIZER_IN_USE, KUBEVIRT_API_VERSION
from cozygpu.decisions import lifecycle
from cozygpu.decisions.lifecycle import Action, Do
from cozygpu.kube import kinds
from cozygpu.kube.adapter import ApiError, AsyncKube, Conflict, NotFound
from cozygpu.runtime.events import Recorder
from cozygpu.state.cluster import Cluster, DeviceKey

log = structlog.get_logger("cozygpu.collector")

METADATA = {Do.OWN, Do.ADD_FINALIZER, Do.REMOVE_FINALIZER}


class Collector:
    def __init__(
        self,
        cluster: Cluster,
        kube: AsyncKube,
        events: Recorder,
        *,
        grace: float,
        sweep_interval: float,
        on_write: Callable[[], None] = lambda: None,
    ) -> None:
        self._cluster = cluster
        self._kube = kube
        self._events = events
        self._grace = dt.timedelta(seconds=grace)
        self._sweep_interval = sweep_interval
        self._on_write = on_write
        self._dirty: set[DeviceKey] = set()
        self._dirty_classes: set[str] = set()
        self._wake = asyncio.Event()
        # Devices waiting on a grace period, and when it runs out: the next wake-up.
        self._due: dict[DeviceKey, dt.datetime] = {}

    # -- what events touch ---------------------------------------------------

    def touch_device(self, namespace: str, name: str) -> None:
        self._dirty.add((namespace, name))
        self._wake.set()

    def touch_vmi(self, namespace: str, vmi: str) -> None:
        for d in self._cluster.attached_to(namespace, vmi):
            self._dirty.add((namespace, d.name))
        self._wake.set()

    def touch_class(self, name: str) -> None:
        self._dirty_classes.add(name)
        self._wake.set()

    # -- the loop ------------------------------------------------------------

    async def run(self) -> None:
        next_sweep = 0.0
        while True:
            self._wake.clear()
            if time.monotonic() >= next_sweep:
                self._dirty |= set(self._cluster.devices)
                self._dirty_classes |= set(self._cluster.classes)
                next_sweep = time.monotonic() + self._sweep_interval
            try:
                await self._drain()
            except Exception:
                log.exception("collector.pass_failed")
            timeout = max(0.05, min(next_sweep - time.monotonic(), self._until_due()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    def _until_due(self) -> float:
        if not self._due:
            return float("inf")
        return max(0.0, (min(self._due.values()) - utcnow()).total_seconds()) + 0.05

    async def _drain(self) -> None:
        classes, self._dirty_classes = self._dirty_classes, set()
        for name in sorted(classes):
            cls = self._cluster.classes.get(name)
            if cls is not None:
                await self._fix_class(cls)
        now = utcnow()
        keys, self._dirty = self._dirty, set()  # what events mark meanwhile waits for the next pass
        for key in sorted(keys | {k for k, when in self._due.items() if when <= now}):
            device = self._cluster.devices.get(key)
            if device is not None:
                actions = lifecycle.device_actions(self._cluster, device, now, self._grace)
                if actions:
                    await self._apply(device, actions)
            after = self._cluster.devices.get(key)
            when = lifecycle.due(after, self._grace) if after is not None else None
            if when is None:
                self._due.pop(key, None)
            else:
                self._due[key] = when

    # -- devices --------------------------------------------------------------

    async def _apply(self, device: GPUDevice, actions: list[Action]) -> None:
        key = (device.namespace or "", device.name)
        current: GPUDevice | None = device
        try:
            for action in actions:
                if current is None:
                    return
                current = await self._do(current, action)
                log.info(
                    f"device.{action.do.value}", namespace=key[0], device=key[1], reason=action.reason, uid=action.uid
                )
        except Conflict:
            fresh = await self._kube.get_or_none(kinds.GPU_DEVICE, key[1], key[0])
            if fresh is None:
                self._cluster.remove_device(*key)
            else:
                self._cluster.upsert_device(fresh)
            self._dirty.add(key)
            self._wake.set()
        except NotFound:
            self._cluster.remove_device(*key)
        except ApiError as e:
            log.warning("collector.write_failed", namespace=key[0], device=key[1], error=e.message)

    async def _do(self, device: GPUDevice, action: Action) -> GPUDevice | None:
        namespace = device.namespace or ""
        meta = device.metadata
        if action.do is Do.DELETE:
            target: GPUDevice | None = device
            if FINALIZER_IN_USE in meta.finalizers:
                target = await self._write_meta(
                    device, finalizers=[f for f in meta.finalizers if f != FINALIZER_IN_USE]
                )
            if target is not None:  # None: dropping the finalizer already finished a deletion
                gone = not await self._kube.delete(kinds.GPU_DEVICE, target.name, namespace, uid=target.metadata.uid)
                if gone:  # deleted before we got to it, and the view missed it (a watch gap): forget it
                    self._cluster.remove_device(namespace, target.name)
            self._events.post(device, "Released", f"deleted: {action.reason}")
            return None
        if action.do in METADATA:
            if action.do is Do.OWN:
                owner = OwnerReference(
                    api_version=KUBEVIRT_API_VERSION,
                    kind="VirtualMachineInstance",
                    name=device.status.attached_to.vmi if device.status.attached_to else "",
                    uid=action.uid,
                )
                return await self._write_meta(device, owner_references=[*meta.owner_references, owner])
            if action.do is Do.ADD_FINALIZER:
                return await self._write_meta(device, finalizers=[*meta.finalizers, FINALIZER_IN_USE])
            return await self._write_meta(device, finalizers=[f for f in meta.finalizers if f != FINALIZER_IN_USE])
        status = device.status
        if action.do is Do.RECORD_UID and status.attached_to is not None:
            status = status.model_copy(
                update={"attached_to": status.attached_to.model_copy(update={"uid": action.uid})}
            )
        elif action.do is Do.DETACH:
            status = status.model_copy(update={"attached_to": None, "bind_request": None})
        elif action.do is Do.CLEAR_REQUEST:
            status = status.model_copy(update={"bind_request": None})
        body = await self._kube.replace_status(kinds.GPU_DEVICE, device.model_copy(update={"status": status}).wire())
        if action.do is Do.DETACH:
            self._events.post(device, "Released", action.reason)
        return self._seen(body)

    async def _write_meta(self, device: GPUDevice, **changes: object) -> GPUDevice | None:
        updated = device.model_copy(update={"metadata": device.metadata.model_copy(update=changes)})
        body = await self._kube.replace(kinds.GPU_DEVICE, updated.wire())
        return self._seen(body)

    def _seen(self, body: dict[str, object]) -> GPUDevice | None:
        """The write's response into the view; None when the device was removed meanwhile."""
        stored = self._cluster.upsert_device(body)
        self._on_write()
        return stored

    # -- classes --------------------------------------------------------------

    async def _fix_class(self, cls: GPUClass) -> None:
        action = lifecycle.class_action(self._cluster, cls)
        if action is None:
            return
        finalizers = [f for f in cls.metadata.finalizers if f != FINALIZER_IN_USE]
        if action is Do.ADD_FINALIZER:
            finalizers.append(FINALIZER_IN_USE)
        updated = cls.model_copy(update={"metadata": cls.metadata.model_copy(update={"finalizers": finalizers})})
        try:
            body = await self._kube.replace(kinds.GPU_CLASS, updated.wire())
        except (Conflict, NotFound):
            self._dirty_classes.add(cls.name)
            fresh = await self._kube.get_or_none(kinds.GPU_CLASS, cls.name)
            if fresh is None:
                self._cluster.remove_class(cls.name)
            else:
                self._cluster.upsert_class(fresh)
            return
        except ApiError as e:
            # Say so and go on with the rest of the pass; the next sweep tries again.
            log.warning("collector.write_failed", gpuclass=cls.name, error=e.message)
            return
        self._cluster.upsert_class(body)
        log.info(f"class.{action.value}", gpuclass=cls.name)
