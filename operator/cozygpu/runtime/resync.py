"""The resync (§6.4): list every watched kind and make the view agree with what the API has.

Called by the Operator once at start-up (the view is seeded from it) and then every sweep
interval by `Resync.every`, the safety net for whatever a watch gap or the start-up race
between our list and kopf's own hid. Listed objects go in through the view's one door
as events; objects the view holds but a list lacks are forgotten as a DELETED event
would forget them.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog

from cozygpu.api import kinds
from cozygpu.kube.adapter import ApiError, AsyncKube
from cozygpu.runtime.view import View

log = structlog.get_logger("cozygpu.operator")

# The first resync closes the start-up race between our list and the watch's own.
FIRST_RESYNC = 5.0
PAGE = 500


def _key(kind: kinds.Kind, body: dict[str, Any]) -> Any:
    meta = body.get("metadata", {})
    return (meta.get("namespace", ""), meta.get("name", "")) if kind.namespaced else meta.get("name", "")


class Resync:
    def __init__(self, view: View, kube: AsyncKube) -> None:
        self._view = view
        self._kube = kube

    async def once(self) -> int:
        """List every kind and make the view agree; returns how many objects it had lost track of.

        What the view holds at a version no newer than the list but the list lacks was removed where no
        watch event said so, and is removed here the way a DELETED event would remove it (a VMI's
        devices are detached, say)."""
        cluster = self._view.cluster
        forgotten, started, skipped = 0, time.monotonic(), 0
        for kind in kinds.WATCHED:
            listed: set[Any] = set()
            version, after = "", ""
            while True:
                # Pages, and the event loop's turn between them: a resync of 50,000 devices must not hold up
                # admissions (§13.3), nor hold every object of a kind in memory at once.
                items, version, after = await self._kube.list_page(kind, PAGE, after)
                for item in items:
                    key = _key(kind, item)
                    listed.add(key)
                    if cluster.holds(kind.kind, key, item.get("metadata", {}).get("resourceVersion")):
                        skipped += 1  # what the view has at this very version needs no second reading
                        continue
                    self._view.apply(kind.kind, item)
                await asyncio.sleep(0)
                if not after:
                    break
            for key in cluster.missing(kind.kind, listed, version):
                namespace, name = key if isinstance(key, tuple) else ("", key)
                self._view.forget(kind.kind, namespace, name, version)
                log.info("view.forgot", kind=kind.kind, namespace=namespace or None, name=name)
                forgotten += 1
        log.info("view.resynced", forgotten=forgotten, unchanged=skipped,
                 duration_ms=round((time.monotonic() - started) * 1000, 1))  # fmt: skip
        return forgotten

    async def every(self, interval: float) -> None:
        """Resync every `interval` seconds until cancelled, the first one soon after start-up."""
        await asyncio.sleep(min(FIRST_RESYNC, interval))
        while True:
            try:
                await self.once()
            except ApiError as e:
                log.warning("view.resync_failed", error=e.message)
            await asyncio.sleep(interval)
