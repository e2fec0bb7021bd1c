"""The no-bypass policy's parameter and each GPUClass's readiness (§12.3): the managed GPU resources, published
for the API server, and seen enforced before a class's devices take new units.

The ValidatingAdmissionPolicy (runtime.admission.policy) reads which resources are managed from one
ConfigMap in the operator's namespace, which this worker keeps equal to the resourceNames
of the view's GPUClasses: written when a class changes (`changed`), and made sure of every
interval, since anyone with rights in that namespace could delete it (the policy then guards
nothing until it is back: a missing parameter must never refuse every pod in the cluster).

The API server enforces a resource added to the parameter once its own copy has caught up, typically within a
second; a plain pod asking for the resource meanwhile is admitted, and the scheduler may give it units the binder
also counts as free. So while the policy is in force (`guarded`), a class is Ready (`GPUClass.ready`, which the
binder asks before it gives a device new units) only once
- the API server refuses a probe for its resource: a dry-run ConfigMap the policy refuses exactly while the
  parameter it holds names the resource (`policy.probe`);
- the pods admitted before are known: every pod on a node read into the view (`settle`, runtime.watching.podwatch),
  and those asking for the resource that still wait for the scheduler waited for up to PATIENCE, and read again
  one by one until they are placed or gone (`placed`), so a pod kept unschedulable cannot keep a class unready.
Until then the class shows Ready=False, saying what it waits for. Started by the Operator on the Lease holder.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any

import structlog

from cozygpu.api import Condition, ConditionStatus, GPUClass, kinds
from cozygpu.api.meta import now as utcnow
from cozygpu.api.names import CONDITION_READY
from cozygpu.kube.adapter import ApiError, AsyncKube
from cozygpu.runtime.admission import policy
from cozygpu.runtime.writes import Writer
from cozygpu.state.cluster import Change, Cluster

log = structlog.get_logger("cozygpu.guard")

CONFIG_MAP = kinds.kind("ConfigMap")
# While a class waits, the probe is made again after this long, doubling to PROBE_MOST.
PROBE_FIRST = 0.2
PROBE_MOST = 5.0
# At most this many of the pods a class waits for are named in its condition.
NAMED = 5
# How long a class waits for pods admitted before its guard to be scheduled; past it they are only followed.
PATIENCE = 30.0
# A probe still allowed this long after the parameter named its resource: the API server no longer follows the
# parameter. It stops for good once the binding was gone even a moment (kubernetes/kubernetes#130887).
STALE_AFTER = 30.0

Settle = Callable[[Collection[str]], Awaitable[dict[str, frozenset[str]]]]
Placed = Callable[[str], Awaitable[bool]]


class ManagedResources:
    def __init__(
        self,
        cluster: Cluster,
        kube: AsyncKube,
        writer: Writer,
        namespace: str,
        *,
        interval: float,
        guarded: bool,
        settle: Settle,
        placed: Placed,
    ) -> None:
        """`settle` reads every pod on a node into the view and returns those asking for the resources that wait
        for the scheduler, with the resources each asks for; `placed` says of one of those whether it no longer
        waits (runtime.watching.podwatch)."""
        self._cluster = cluster
        self._kube = kube
        self._writer = writer
        self._namespace = namespace
        self._interval = interval
        self._guarded = guarded
        self._settle = settle
        self._placed = placed
        # Unscheduled pods admitted before a guard: since when, and which of the guarded resources they ask for.
        self._following: dict[str, tuple[float, frozenset[str]]] = {}
        self._wake = asyncio.Event()
        self._written: dict[str, Any] | None = None
        # Resources the API server was seen guarding, their earlier pods settled, since they were last published.
        self._seen: set[str] = set()
        self._refusing: set[str] = set()  # seen refused, their earlier pods not all scheduled yet
        self._allowed_since: dict[str, float] = {}  # resources whose probe the API server still allows, since when

    def changed(self, change: Change) -> None:
        """A class came, went or changed: the list may differ now, and the class may wait to be ready."""
        self._wake.set()

    def wanted(self) -> dict[str, Any]:
        return policy.parameter(self._namespace, (c.spec.resource_name for c in self._cluster.classes.values()))

    async def run(self) -> None:
        pause = PROBE_FIRST
        while True:
            self._wake.clear()
            await self._publish()
            waiting = self._guarded and await self._ready_classes()
            with contextlib.suppress(TimeoutError):  # not wait_for: on 3.11 it can swallow a cancel
                async with asyncio.timeout(pause if waiting else self._interval):
                    await self._wake.wait()
                continue
            if waiting:
                pause = min(PROBE_MOST, pause * 2)
                continue
            pause = PROBE_FIRST
            self._written = await self._current()  # the interval passed: look at what the API server has

    async def _publish(self) -> None:
        wanted = self.wanted()
        if wanted == self._written:
            return
        try:
            await self._kube.put_object(CONFIG_MAP, wanted)
        except ApiError as e:
            log.warning("guard.write_failed", namespace=self._namespace, error=e.message)
            return
        self._written = wanted
        self._seen &= _resources(wanted)
        self._refusing &= _resources(wanted)
        self._allowed_since = {r: t for r, t in self._allowed_since.items() if r in _resources(wanted)}
        log.info("guard.published", namespace=self._namespace, resources=wanted["data"])

    async def _ready_classes(self) -> bool:
        """Probe for the resources of classes not ready, follow the pods admitted before, and mark each class; True
        while some class still waits or a pod is still followed."""
        if self._following:
            await self._follow()
        unready = sorted((c for c in self._cluster.classes.values() if not c.ready()), key=lambda c: c.name)
        if not unready:
            return bool(self._following)
        published = _resources(self._written) if self._written is not None else set()
        new = {c.spec.resource_name for c in unready} & published - self._seen
        probed = {r: await self._probe(r) for r in sorted(new - self._refusing)}
        now = time.monotonic()
        for resource, refused_now in probed.items():
            if refused_now:
                self._allowed_since.pop(resource, None)
            elif now - self._allowed_since.setdefault(resource, now) >= STALE_AFTER:
                log.warning(
                    "guard.parameter_stale", resource=resource, seconds=round(now - self._allowed_since[resource])
                )
        if refused := {r for r, refused_now in probed.items() if refused_now}:
            # One look at every pod for what was admitted before the guard: those on a node go into the view now;
            # those still waiting for the scheduler are followed one by one (`_follow`).
            now = time.monotonic()
            for key, asks in (await self._settle(refused)).items():
                self._following.setdefault(key, (now, asks))
            self._refusing |= refused
        if enforced := {r for r in self._refusing if not self._waited_for(r)}:
            self._seen |= enforced
            self._refusing -= enforced
            log.info("guard.enforced", resources=sorted(enforced), following=sorted(self._following)[:NAMED])
        for cls in unready:
            await self._mark(cls)
        return bool(self._following) or any(c.spec.resource_name not in self._seen for c in unready)

    def _waited_for(self, resource: str) -> list[str]:
        """The followed pods asking for `resource` young enough to wait for: one the scheduler places within
        PATIENCE is counted before any class of the resource is ready; one it cannot place (a tenant's pod kept
        unschedulable) is only followed, so it cannot keep a class from being ready."""
        now = time.monotonic()
        return sorted(k for k, (since, asks) in self._following.items() if resource in asks and now - since < PATIENCE)

    async def _follow(self) -> None:
        for key in sorted(self._following):
            try:
                done = await self._placed(key)
            except ApiError as e:
                log.warning("guard.follow_failed", pod=key, error=e.message)
                continue
            if done:
                del self._following[key]

    async def _probe(self, resource: str) -> bool:
        """Whether the API server refuses the probe for `resource`, as the policy does once it guards it."""
        try:
            await self._kube.create(CONFIG_MAP, policy.probe(self._namespace, resource), dry_run=True)
        except ApiError as e:
            if policy.NAME in e.message and policy.PROBE_GUARDED in e.message:
                return True
            log.warning("guard.probe_failed", namespace=self._namespace, resource=resource, error=e.message)
        return False

    async def _mark(self, cls: GPUClass) -> None:
        """The class's Ready condition for its spec as it is, written if it differs."""
        resource = cls.spec.resource_name
        if resource in self._seen:
            status, reason = ConditionStatus.TRUE, "Guarded"
            message = f"the no-bypass policy refuses pods that ask for {resource} behind the operator's back"
        elif resource in self._refusing:
            status, reason = ConditionStatus.FALSE, "AwaitingPods"
            waiting = self._waited_for(resource)
            more = f" and {len(waiting) - NAMED} more" if len(waiting) > NAMED else ""
            message = (
                f"the no-bypass policy guards {resource} now; pods admitted before it wait for the scheduler "
                f"(up to {PATIENCE:.0f} s): " + ", ".join(waiting[:NAMED]) + more
            )
        else:
            status, reason = ConditionStatus.FALSE, "AwaitingGuard"
            message = (
                f"devices of the class take units once the API server is seen refusing pods that ask for {resource}"
            )
            since = self._allowed_since.get(resource)
            if since is not None and time.monotonic() - since >= STALE_AFTER:
                message += (
                    f"; for {STALE_AFTER:.0f} s the API server has not taken up the policy's parameter, which it stops"
                    " following for good once the policy's binding was gone even a moment (helm uninstall, the policy"
                    " turned off and on; kubernetes/kubernetes#130887): restart the API servers"
                )
        before = next((c for c in cls.status.conditions if c.type == CONDITION_READY), None)
        if before is not None and (before.status, before.reason, before.message, before.observed_generation) == (
            status,
            reason,
            message,
            cls.metadata.generation,
        ):
            return
        condition = Condition(
            type=CONDITION_READY,
            status=status,
            reason=reason,
            message=message,
            last_transition_time=before.last_transition_time if before and before.status == status else utcnow(),
            observed_generation=cls.metadata.generation,
        )
        conditions = [c for c in cls.status.conditions if c.type != CONDITION_READY] + [condition]
        body = cls.model_copy(update={"status": cls.status.model_copy(update={"conditions": conditions})}).wire()
        try:
            outcome = await self._writer.replace_status(kinds.GPU_CLASS, body)
        except ApiError as e:
            log.warning("guard.status_write_failed", gpuclass=cls.name, error=e.message)
            return
        if outcome.written:
            log.info(
                "gpuclass.ready" if status is ConditionStatus.TRUE else "gpuclass.waiting",
                gpuclass=cls.name,
                reason=reason,
            )
        else:
            self._wake.set()  # someone wrote first: decided again on what the view has now

    async def _current(self) -> dict[str, Any] | None:
        try:
            body = await self._kube.get_or_none(CONFIG_MAP, policy.MANAGED_RESOURCES, self._namespace)
        except ApiError as e:
            log.warning("guard.read_failed", namespace=self._namespace, error=e.message)
            return None
        if body is None:
            return None
        return policy.parameter(self._namespace, []) | {"data": body.get("data") or {}}


def _resources(parameter: dict[str, Any]) -> set[str]:
    text = (parameter.get("data") or {}).get(policy.RESOURCES_KEY) or ""
    return set(text.split(",")) - {""}
