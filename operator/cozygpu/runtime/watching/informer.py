"""Informers: the operator's own list-then-watch of one kind, into the view's one door (§6.4, §13).

An informer lists its kind in pages and makes the view agree (what the view holds at a
version no newer than the list, but the list lacks, was removed where no event said so,
and is forgotten as a DELETED event would forget it); then it watches from the list's
resourceVersion, with bookmarks, so nothing between the list and the watch is missed.
A stream the server ends is resumed from the last version seen; a version that expired
(410) is listed anew; any error of the API or the network is logged, retried with
capped backoff and jitter, and followed by a fresh list, so the task never ends on its
own and the view agrees with the API again once it answers. `failing` says what failed
until then, for /readyz.

Called by the Operator (one per watched kind; the resync lists through them), and by
the pod watch (runtime.watching.podwatch) with selectors. kopf watches nothing: no per-object
state of kopf's is kept, and no handler machinery runs per event.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from cozygpu.api import kinds
from cozygpu.kube.adapter import ApiError, AsyncKube
from cozygpu.runtime.view import View

log = structlog.get_logger("cozygpu.watch")

PAGE = 500
BACKOFF = (0.5, 30.0)  # the first retry's delay and the cap, seconds
# A stream that had been up this long before it failed was working: its failure is a new incident, retried
# from the first delay, not the next step of the last one's backoff (which grew with every API server restart).
HEALTHY = 5.0


def failures_after(failures: int, up_for: float) -> int:
    """The failure count for the backoff: a stream (or attempt) that was up longer than HEALTHY starts anew."""
    return 1 if up_for > HEALTHY else failures + 1


class Expired(Exception):
    """The version to resume from is too old for the server (410 Gone): list anew."""


def _version(body: dict[str, Any]) -> str:
    return str((body.get("metadata") or {}).get("resourceVersion") or "")


class Informer:
    def __init__(
        self,
        view: View,
        kube: AsyncKube,
        kind: kinds.Kind,
        *,
        label_selector: str = "",
        field_selector: str = "",
        wanted: Callable[[dict[str, Any]], bool] | None = None,
        in_scope: Callable[[Any], bool] | None = None,
        confirm: Callable[[Any], Awaitable[None]] | None = None,
        timeout: int,
    ) -> None:
        """`wanted`: objects worth a look at all (others not even a Change, unless the view holds them);
        `in_scope`: which keys the view holds that this informer's selectors cover (all by default);
        `confirm`: for a label selection an object's owner can leave, reads a key fresh into the view (or forgets
        it) where a DELETED event or a list's absence may only mean the object left the selection."""
        self.kind = kind
        self._view = view
        self._kube = kube
        self._labels = label_selector
        self._fields = field_selector
        self._wanted = wanted
        self._in_scope = in_scope
        self._confirm = confirm
        self._timeout = timeout
        self._at = ""  # the version the watch resumes from; empty: list first
        self.failing: str | None = None  # what failed, until a list succeeds again (for /readyz)

    def _take(self, body: dict[str, Any], *, deleted: bool = False) -> None:
        key = self.kind.key_of(body)
        if not deleted and self._view.cluster.holds(self.kind, key, _version(body)):
            # The view has this very version already, most often from our own write's answer (the writer applies
            # it at once): as a list skips it, the watch's copy is not parsed again (issue 22 item 4).
            return
        unwanted = self._wanted is not None and not deleted and not self._wanted(body)
        if unwanted and not self._view.cluster.knows(self.kind, key):
            return
        self._view.apply(self.kind, body, deleted=deleted)

    def _covered(self, key: Any) -> bool:
        return self._view.cluster.knows(self.kind, key) and (self._in_scope is None or self._in_scope(key))

    async def list(self, *, resume: bool = True) -> tuple[int, int]:
        """List and make the view agree; returns (forgotten, unchanged). With `resume`, the watch continues
        from this list's version."""
        cluster = self._view.cluster
        listed: set[Any] = set()
        version, after, unchanged = "", "", 0
        while True:
            # Pages, and the event loop's turn between them: a list of 50,000 devices must not hold up
            # admissions (§13.3), nor hold every object of a kind in memory at once.
            items, version, after = await self._kube.list_page(
                self.kind, PAGE, after, label_selector=self._labels, field_selector=self._fields
            )
            for item in items:
                key = self.kind.key_of(item)
                listed.add(key)
                if cluster.holds(self.kind, key, _version(item)):
                    unchanged += 1  # what the view has at this very version needs no second reading
                    continue
                self._take(item)
            await asyncio.sleep(0)
            if not after:
                break
        forgotten = 0
        for key in cluster.missing(self.kind, listed, version):
            if self._in_scope is not None and not self._in_scope(key):
                continue
            namespace, name = key if isinstance(key, tuple) else ("", key)
            if self._confirm is not None:
                await self._confirm(key)
                continue
            self._view.forget(self.kind, namespace, name, version)
            log.info("view.forgot", kind=self.kind.kind, namespace=namespace or None, name=name)
            forgotten += 1
        if resume:
            self._at = version
            self.failing = None
            self._view.progressed(self.kind, version)
        return forgotten, unchanged

    async def run(self) -> None:
        """Watch until cancelled, from the last list (made first if there is none)."""
        failures = 0
        while True:
            streaming = time.monotonic()  # since this attempt, then since its stream began
            try:
                if not self._at:
                    started = time.monotonic()
                    forgotten, _ = await self.list()
                    log.info(
                        "watch.listed",
                        kind=self.kind.kind,
                        forgotten=forgotten,
                        duration_ms=round((time.monotonic() - started) * 1000, 1),
                    )
                streaming = time.monotonic()
                await self._follow()
                failures = 0
            except Expired:
                log.info("watch.expired", kind=self.kind.kind)
                self._at = ""
            except asyncio.CancelledError:
                raise
            except Exception as e:
                failures = failures_after(failures, time.monotonic() - streaming)
                delay = min(BACKOFF[1], BACKOFF[0] * 2 ** min(failures - 1, 10)) * random.uniform(0.5, 1.0)
                # Listed anew, not resumed: whatever happened while the stream was broken (an API server
                # restart, a compaction) the view agrees with the API again before it reports ready.
                self._at = ""
                self.failing = str(e) or type(e).__name__
                log.warning(
                    "watch.failed",
                    kind=self.kind.kind,
                    error=str(e) or type(e).__name__,
                    failures=failures,
                    retry_in_s=round(delay, 2),
                )
                await asyncio.sleep(delay)

    async def _follow(self) -> None:
        """One stream from the last version seen, until the server ends it."""
        async for event, body in self._kube.watch(
            self.kind, self._at, label_selector=self._labels, field_selector=self._fields, timeout=self._timeout
        ):
            if event == "ERROR":
                code = int(body.get("code") or 500)
                if code == 410:
                    raise Expired
                raise ApiError(code, str(body.get("reason", "")), str(body.get("message", "")))
            if event == "DELETED" and self._confirm is not None and self._covered(self.kind.key_of(body)):
                await self._confirm(self.kind.key_of(body))
            elif event != "BOOKMARK":
                self._take(body, deleted=event == "DELETED")
            self._at = _version(body) or self._at
            self._view.progressed(self.kind, self._at)
