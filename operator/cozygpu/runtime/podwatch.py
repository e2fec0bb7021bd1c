"""The pods that hold GPU units on nodes, into the view without watching every pod (§1.3, §12, §13).

The GPUNode status shows units held by pods the operator did not place, so a bypass of
the guard (or one that predates it) can be seen. Watching every pod of a GPU cloud is
out of the question, and kopf cannot select on the server, so the operator watches on
its own, through the adapter:

- launcher pods (virt-controller's label) running on a node: a label- and field-selected
  list and watch. Every VM's launcher is in it, the operator's own and those of VMIs it
  did not admit; the view keeps only those asking for an extended resource.
- every other pod: a paged list of pods running on a node, at start-up and every
  `pod_scan_interval`. Since the no-bypass policy (§12.1) no new pod outside an exempt
  namespace can ask for a managed resource, so what the list finds is the old bypass,
  which only shrinks; the pods it found are read again one by one every sweep interval,
  so one that ends leaves the status within a minute.

Everything goes into the view through its one door (runtime.view) as kind "Pod". Called
by the Operator: `start` before it reports ready, `run` as a task; failures are logged
and retried with backoff, and a 410 (the version expired) lists anew.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import structlog

from cozygpu.api import kinds
from cozygpu.api.names import LABEL_KUBEVIRT, LAUNCHER
from cozygpu.api.pods import EXTENDED, asked
from cozygpu.kube.adapter import ApiError, AsyncKube
from cozygpu.runtime.view import View
from cozygpu.state.pods import PodUsage

log = structlog.get_logger("cozygpu.pods")

LAUNCHERS = f"{LABEL_KUBEVIRT}={LAUNCHER}"
# Pods that can hold units: placed on a node and not ended. One that leaves the selection arrives as DELETED.
HOLDING = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
PAGE = 500
BACKOFF = (0.5, 30.0)


def _key(body: dict[str, Any]) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _version(body: dict[str, Any]) -> str:
    return str((body.get("metadata") or {}).get("resourceVersion") or "")


class Expired(Exception):
    """The watch's resourceVersion is too old (410): list anew."""


class PodWatch:
    def __init__(self, view: View, kube: AsyncKube, *, scan_interval: float, recheck_interval: float) -> None:
        self._view = view
        self._kube = kube
        self._scan_interval = scan_interval
        self._recheck_interval = recheck_interval
        self._launchers_at = ""  # the version the launcher watch resumes from

    @property
    def _pods(self) -> PodUsage:
        return self._view.cluster.pods

    async def start(self) -> None:
        """The first lists: launcher pods, then every pod on a node."""
        self._launchers_at = await self._list(LAUNCHERS)
        await self._list("")

    async def run(self) -> None:
        await asyncio.gather(self._watch_launchers(), self._scan_every(), self._recheck_every())

    async def _list(self, label_selector: str) -> str:
        """A paged list of holding pods into the view; pods of that selection the view holds but the list
        lacks are forgotten. Returns the list's resourceVersion."""
        listed: set[tuple[str, str]] = set()
        version, after, started = "", "", time.monotonic()
        while True:
            items, version, after = await self._kube.list_page(
                kinds.POD, PAGE, after, label_selector=label_selector, field_selector=HOLDING
            )
            for item in items:
                key = _key(item)
                listed.add(key)
                # Most pods ask for no extended resource: not even a Change for them.
                if self._pods.get(*key) is not None or asked(item, EXTENDED, lenient=True):
                    self._view.apply("Pod", item)
            await asyncio.sleep(0)
            if not after:
                break
        launchers_only = bool(label_selector)
        for namespace, name in self._pods.missing(listed, version):
            held = self._pods.get(namespace, name)
            if held is not None and (not launchers_only or held.vmi is not None):
                self._view.forget("Pod", namespace, name, version)
        log.info("pods.listed", selector=label_selector or None, pods=len(listed), holding=len(self._pods),
                 duration_ms=round((time.monotonic() - started) * 1000, 1))  # fmt: skip
        return version

    async def _watch_launchers(self) -> None:
        failures = 0
        while True:
            try:
                if not self._launchers_at:
                    self._launchers_at = await self._list(LAUNCHERS)
                await self._follow()
                failures = 0
            except Expired:
                self._launchers_at = ""  # listed anew at once
            except asyncio.CancelledError:
                raise
            except Exception as e:
                failures += 1
                delay = min(BACKOFF[1], BACKOFF[0] * 2 ** min(failures, 10)) * random.uniform(0.5, 1.0)
                log.warning("pods.watch_failed", error=str(e) or type(e).__name__, retry_in=round(delay, 1))
                if isinstance(e, ApiError) and e.status == 410:
                    self._launchers_at = ""
                await asyncio.sleep(delay)

    async def _follow(self) -> None:
        """One watch stream from the last version seen, until the server ends it."""
        async for kind, body in self._kube.watch(
            kinds.POD, self._launchers_at, label_selector=LAUNCHERS, field_selector=HOLDING
        ):
            if kind == "ERROR":
                if body.get("code") == 410:
                    raise Expired
                raise ApiError(int(body.get("code") or 500), str(body.get("reason", "")), str(body.get("message", "")))
            if kind != "BOOKMARK":
                self._view.apply("Pod", body, deleted=kind == "DELETED")
            self._launchers_at = _version(body) or self._launchers_at

    async def _scan_every(self) -> None:
        while True:
            await asyncio.sleep(self._scan_interval)
            try:
                await self._list("")
            except ApiError as e:
                log.warning("pods.list_failed", error=e.message)

    async def _recheck_every(self) -> None:
        """Read again, one by one, the pods the scan found that no watch follows (few: the old bypass)."""
        while True:
            await asyncio.sleep(self._recheck_interval)
            for namespace, name in list(self._pods.keys()):
                held = self._pods.get(namespace, name)
                if held is None or held.vmi is not None:
                    continue
                try:
                    fresh = await self._kube.get_or_none(kinds.POD, name, namespace)
                except ApiError as e:
                    log.warning("pods.read_failed", namespace=namespace, pod=name, error=e.message)
                    continue
                if fresh is None:
                    self._view.forget("Pod", namespace, name)
                else:
                    self._view.apply("Pod", fresh)
