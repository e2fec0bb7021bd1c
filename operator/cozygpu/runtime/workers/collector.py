"""The collector (§6): attachments, ownership, finalizers and garbage, kept right.

Event-driven: the view's changes (`changed`) mark the devices a VMI, device or class
event touches and the collector applies `decisions.lifecycle` to them at once, writing
through the one writer (runtime.writes). Time-driven where the
design is: it wakes when the earliest grace period runs out. And a full sweep every
sweep interval catches whatever a restart or a watch gap hid (§6.4).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import heapq
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from cozygpu.api import GPUClass, GPUDevice, kinds
from cozygpu.api.kubevirt import wants_to_run
from cozygpu.api.meta import now as utcnow
from cozygpu.api.names import FINALIZER_IN_USE
from cozygpu.decisions import lifecycle
from cozygpu.decisions.lifecycle import Action, Do
from cozygpu.kube.adapter import ApiError
from cozygpu.runtime.breath import Breath
from cozygpu.runtime.events import Recorder
from cozygpu.runtime.writes import Body, Outcome, State, Step, Writer
from cozygpu.state.cluster import Change, Cluster, DeviceKey

log = structlog.get_logger("cozygpu.collector")


class Collector:
    def __init__(
        self,
        cluster: Cluster,
        writer: Writer,
        events: Recorder,
        *,
        grace: float,
        sweep_interval: float,
        read_vm: Callable[[str, str], Awaitable[dict[str, Any] | None]] | None = None,
    ) -> None:
        """`read_vm`: a fresh read of a VirtualMachine (namespace, name), for a kept device (§6.6); the view keeps
        no VMs. Without it, a template device's VM never wants to run."""
        self._cluster = cluster
        self._read_vm = read_vm
        self._writer = writer
        self._events = events
        self._grace = dt.timedelta(seconds=grace)
        self._sweep_interval = sweep_interval
        self._dirty: set[DeviceKey] = set()
        self._dirty_classes: set[str] = set()
        self._wake = asyncio.Event()
        # Devices waiting on a grace period, and when it runs out: the next wake-up.
        self._due: dict[DeviceKey, dt.datetime] = {}
        # The same, soonest first; an entry `_due` no longer holds is skipped when it comes up (thousands wait in
        # a mass restart's grace period: a pass takes the due ones off the top, not a walk over all).
        self._due_order: list[tuple[dt.datetime, DeviceKey]] = []

    # -- what events touch ---------------------------------------------------

    def changed(self, change: Change) -> None:
        """A change of a device, a VMI, a class or a launcher pod: what it touches is looked at on the next pass."""
        match change.kind:
            case kinds.GPU_DEVICE:
                self.touch_device(change.namespace, change.name)
            case kinds.VMI:
                self.touch_vmi(change.namespace, change.name)
            case kinds.GPU_CLASS:
                self.touch_class(change.name)
            case kinds.POD:
                for namespace, vmi in change.guests_gone:  # §6.7: a set held for its guest may go now
                    self.touch_vmi(namespace, vmi)

    def touch_device(self, namespace: str, name: str) -> None:
        self._dirty.add((namespace, name))
        self._wake.set()

    def touch_vmi(self, namespace: str, vmi: str) -> None:
        for d in self._cluster.devices.attached_to(namespace, vmi):
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
            with contextlib.suppress(TimeoutError):  # not wait_for: on 3.11 it can swallow a cancel
                async with asyncio.timeout(timeout):
                    await self._wake.wait()

    def _until_due(self) -> float:
        soonest = self._soonest()
        if soonest is None:
            return float("inf")
        return max(0.0, (soonest - utcnow()).total_seconds()) + 0.05

    def _soonest(self) -> dt.datetime | None:
        while self._due_order:
            when, key = self._due_order[0]
            if self._due.get(key) == when:
                return when
            heapq.heappop(self._due_order)  # moved or no longer due
        return None

    def _take_due(self, now: dt.datetime) -> set[DeviceKey]:
        due = set()
        while (soonest := self._soonest()) is not None and soonest <= now:
            due.add(heapq.heappop(self._due_order)[1])
        return due

    async def _drain(self) -> None:
        classes, self._dirty_classes = self._dirty_classes, set()
        for name in sorted(classes):
            cls = self._cluster.classes.get(name)
            if cls is not None:
                await self._fix_class(cls)
        now = utcnow()
        keys, self._dirty = self._dirty, set()  # what events mark meanwhile waits for the next pass
        taken = self._take_due(now)
        # The sweep looks at every device (60 s apart): 0.4 s at 50,000 devices, not at a stretch (§14.3).
        breathe = Breath(every=64)
        for key in sorted(keys | taken):
            await breathe()
            device = self._cluster.devices.get(key)
            if device is not None:
                await self._settle(device, now)
            after = self._cluster.devices.get(key)
            when = lifecycle.due(after, self._grace, now) if after is not None else None
            if when is None:
                self._due.pop(key, None)
            elif self._due.get(key) != when or key in taken:
                self._due[key] = when
                heapq.heappush(self._due_order, (when, key))

    # -- devices --------------------------------------------------------------

    async def _actions(self, device: GPUDevice, now: dt.datetime) -> list[Action]:
        """The decision, with the owner VM's wish to run read fresh when it needs it (§6.6)."""
        actions = lifecycle.device_actions(self._cluster, device, now, self._grace)
        if not actions or actions[0].do is not Do.READ_VM:
            return actions
        ask = actions[0]
        try:
            vm = await self._read_vm(device.namespace or "", ask.vm) if self._read_vm is not None else None
        except ApiError as e:
            # Not known is not stopped: decided again on the next pass (the device is due).
            log.warning(
                "collector.vm_unread", namespace=device.namespace, device=device.name, vm=ask.vm, error=e.message
            )
            return []
        runs = vm is not None and (vm.get("metadata") or {}).get("uid") == ask.uid and wants_to_run(vm)
        return lifecycle.device_actions(self._cluster, device, now, self._grace, vm_runs=runs)

    async def _settle(self, device: GPUDevice, now: dt.datetime) -> None:
        """Decide on the device and make the decision's writes; when someone wrote first, decide again on their
        version, which the writer put in the view (`Writer.update`). Raced every time: the next pass looks again."""
        key = device.key

        async def decide(_: Body | None) -> Step | None:
            current = self._cluster.devices.get(key)
            actions = await self._actions(current, now) if current is not None else []
            if current is None or not actions:
                return None
            return functools.partial(self._write_runs, current, lifecycle.runs(actions))

        try:
            outcome = await self._writer.update(None, decide)
        except ApiError as e:
            log.warning("collector.write_failed", namespace=key[0], device=key[1], error=e.message)
            return
        if outcome.state is State.CONFLICT:
            self._dirty.add(key)
            self._wake.set()

    async def _write_runs(self, device: GPUDevice, runs: list[list[Action]]) -> Outcome:
        """The writes of one decision in turn, each on the device as the one before left it; the first that did
        not land ends them with its outcome (a CONFLICT: decided again on what the API has now)."""
        current: GPUDevice | None = device
        for run in runs:
            if current is None:
                break
            outcome = await self._do(current, run)
            if not outcome.written:
                return outcome
            for a in run:
                log.info(
                    f"device.{a.do.value}", namespace=device.namespace, device=device.name, reason=a.reason, uid=a.uid
                )
            # A deleted device takes no more writes; any other is written on as the view has it now.
            current = None if run[0].do is Do.DELETE else self._cluster.devices.get(device.key)
        return Outcome(State.LANDED)

    async def _do(self, device: GPUDevice, run: list[Action]) -> Outcome:
        """One write: a status action, a delete, or a run of metadata actions together."""
        namespace, action = device.namespace or "", run[0]
        meta = device.metadata
        if action.do is Do.DELETE:
            if FINALIZER_IN_USE in meta.finalizers:
                dropped = await self._write_meta(device, **lifecycle.metadata_changes(device, action))
                if not dropped.written:
                    return dropped
                target = self._cluster.devices.get(device.key)
            else:
                target = device
            if target is not None:  # None: dropping the finalizer already finished a deletion
                # Gone before we got to it (the view missed it in a watch gap): the writer forgets it. Under the
                # version decided on: an admission reusing the device meanwhile (a quick restart) wins.
                outcome = await self._writer.delete(
                    kinds.GPU_DEVICE,
                    target.name,
                    namespace,
                    uid=target.metadata.uid,
                    resource_version=target.metadata.resource_version,
                )
                if outcome.state is State.CONFLICT:
                    return outcome
            self._events.post(device, "Released", f"deleted: {action.reason}")
            return Outcome(State.LANDED)
        if action.do in lifecycle.METADATA:
            return await self._write_meta(device, **lifecycle.metadata_changes_of(device, run))
        status = lifecycle.status_after(device, action)
        outcome = await self._writer.replace_status(
            kinds.GPU_DEVICE, device.model_copy(update={"status": status}).wire()
        )
        if outcome.written and action.do is Do.DETACH:
            self._events.post(device, "Released", action.reason)
        if outcome.written and action.do is Do.KEEP:
            self._events.post(device, "Kept", action.reason)
        return outcome

    async def _write_meta(self, device: GPUDevice, **changes: object) -> Outcome:
        """A patch of the changed fields under the device's version: the view's copy leaves out what a replace
        would drop. Landed, the view has the device as the write left it (or not at all: it finished a deletion)."""
        updated = device.metadata.model_copy(update=changes)
        fields = updated.model_dump(by_alias=True, exclude_none=True, mode="json", include=set(changes))
        patch = {"metadata": {"resourceVersion": device.metadata.resource_version, **fields}}
        return await self._writer.patch(kinds.GPU_DEVICE, device.name, device.namespace or "", patch)

    # -- classes --------------------------------------------------------------

    async def _fix_class(self, cls: GPUClass) -> None:
        action = lifecycle.class_action(self._cluster, cls)
        if action is None:
            return
        finalizers = lifecycle.protected(cls.metadata.finalizers, protect=action is Do.ADD_FINALIZER)
        updated = cls.model_copy(update={"metadata": cls.metadata.model_copy(update={"finalizers": finalizers})})
        try:
            outcome = await self._writer.replace(kinds.GPU_CLASS, updated.wire())
        except ApiError as e:
            # Say so and go on with the rest of the pass; the next sweep tries again.
            log.warning("collector.write_failed", gpuclass=cls.name, error=e.message)
            return
        if not outcome.written:
            self._dirty_classes.add(cls.name)  # someone wrote first: looked at again with their version
            return
        log.info(f"class.{action.value}", gpuclass=cls.name)
