"""The pods that hold GPU units on nodes, into the view without watching every pod (§1.3, §12, §13).

The GPUNode status shows units held by pods the operator did not place, so a bypass of
the guard (or one that predates it) can be seen, and placement does not count those
units as free. Watching every pod of a GPU cloud is out of the question, so:

- launcher pods running on a node: an informer (runtime.watching.informer) selecting the
  `kubevirt.io` label, whatever its value, and a field selector. Every VM's launcher is in it,
  the operator's own and those of VMIs it did not admit. A pod is a launcher by its VMI
  controller reference, as KubeVirt tells its own pods, and stays one while it lives; one that
  leaves the selection (its tenant removed the label) is read fresh, not forgotten, and then
  read again every sweep like the scan's pods, so a relabelled launcher never hides a running
  guest (§6.7, issue 34 item 1).
- every other pod: a paged list of pods running on a node, at start-up and every
  `pod_scan_interval`. Since the no-bypass policy (§12.1) no new pod outside an exempt
  namespace can ask for a managed resource, so what the list finds is the old bypass,
  which only shrinks; the pods it found are read again one by one every sweep interval,
  so one that ends leaves the status within a minute.

Only pods asking for an extended resource reach the view (kind "Pod", through its one
door), and of those only what `state.pods` keeps. Called by the Operator: `start`
before it reports ready, `run` as a task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any

import structlog

from cozygpu.api import kinds
from cozygpu.api.names import LABEL_KUBEVIRT
from cozygpu.api.pods import EXTENDED, asked
from cozygpu.kube.adapter import AsyncKube
from cozygpu.runtime.view import View
from cozygpu.runtime.watching.informer import PAGE, Informer
from cozygpu.runtime.writes import Writer

log = structlog.get_logger("cozygpu.pods")

LAUNCHERS = LABEL_KUBEVIRT  # the key alone, as KubeVirt's own pod informer selects: a tenant may change the value
# Pods that can hold units: placed on a node and not ended. One that leaves the selection arrives as DELETED.
HOLDING = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
UNPLACED = "spec.nodeName=,status.phase=Pending"  # admitted, not yet scheduled


def _asks(body: dict[str, Any]) -> bool:
    return bool(asked(body, EXTENDED, lenient=True))


class PodWatch:
    def __init__(
        self,
        view: View,
        kube: AsyncKube,
        writer: Writer,
        *,
        scan_interval: float,
        recheck_interval: float,
        watch_timeout: int,
    ) -> None:
        self._view = view
        self._kube = kube
        self._writer = writer
        self._scan_interval = scan_interval
        self._recheck_interval = recheck_interval
        cluster = view.cluster

        def launcher(key: Any) -> bool:
            held = cluster.pods.get(*key)
            return held is not None and held.vmi is not None and held.watched

        self._launchers = Informer(
            view,
            kube,
            kinds.POD,
            label_selector=LAUNCHERS,
            field_selector=HOLDING,
            wanted=_asks,
            in_scope=launcher,
            confirm=self._read,
            timeout=watch_timeout,
        )
        self._everything = Informer(view, kube, kinds.POD, field_selector=HOLDING, wanted=_asks, timeout=watch_timeout)

    @property
    def informers(self) -> list[Informer]:
        return [self._launchers]

    async def start(self) -> None:
        """The first lists: launcher pods (the watch resumes from there), then every pod on a node."""
        await self._launchers.list()
        await self._scan()

    async def run(self) -> None:
        # A group: should one of them ever fail, the others end with it and the supervisor starts all again.
        async with asyncio.TaskGroup() as group:
            for part in (self._launchers.run(), self._scan_every(), self._recheck_every()):
                group.create_task(part)

    async def settle(self, resources: Collection[str]) -> dict[str, frozenset[str]]:
        """§12.3, for the guard once the no-bypass policy is seen guarding `resources`: every pod on a node read into
        the view now (one scan, not waiting for the next), and the pods not yet on a node that ask for any of them,
        as namespace/name with the resources each asks for. Those were admitted before the guard; until the
        scheduler has placed them, which units they will take is unknown."""
        await self._scan()
        unplaced: dict[str, frozenset[str]] = {}
        after, wanted = "", set(resources)
        while True:
            items, _, after = await self._kube.list_page(kinds.POD, PAGE, after, field_selector=UNPLACED)
            for item in items:
                if asks := asked(item, wanted, lenient=True):
                    meta = item.get("metadata") or {}
                    unplaced[f"{meta.get('namespace')}/{meta.get('name')}"] = frozenset(asks)
            if not after:
                return unplaced

    async def placed(self, key: str) -> bool:
        """Whether a pod `settle` found waiting for the scheduler ("namespace/name") waits no more: gone, ended, or
        on a node, and then read into the view, where it holds its units."""
        namespace, _, name = key.partition("/")
        body = await self._kube.get_or_none(kinds.POD, name, namespace)
        if body is None or (body.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return True
        if not (body.get("spec") or {}).get("nodeName"):
            return False
        await self._read((namespace, name))
        return True

    async def _scan(self) -> None:
        forgotten, _ = await self._everything.list(resume=False)
        log.info("pods.scanned", holding=self._view.cluster.pods.holding(), forgotten=forgotten)

    async def _scan_every(self) -> None:
        while True:
            await asyncio.sleep(self._scan_interval)
            try:
                await self._scan()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("pods.scan_failed", error=str(e) or type(e).__name__)

    async def _read(self, key: tuple[str, str]) -> None:
        """A pod fresh into the view, or forgotten if it is gone (or no longer holds units)."""
        await self._writer.read(kinds.POD, key[1], key[0])

    async def _recheck_every(self) -> None:
        """Read again, one by one, the pods no watch follows: those the scan found (few: the old bypass), and
        launchers whose tenant took them out of the launcher informer's selection."""
        cluster = self._view.cluster
        while True:
            await asyncio.sleep(self._recheck_interval)
            for namespace, name in list(cluster.pods.keys()):
                held = cluster.pods.get(namespace, name)
                if held is None or (held.vmi is not None and held.watched):
                    continue
                try:
                    await self._read((namespace, name))
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # the API or the network: read again next time
                    log.warning("pods.read_failed", namespace=namespace, pod=name, error=str(e) or type(e).__name__)
