"""Held-device orders admitted by any replica and not yet seen, kept in the API: §7.4 across replicas.

Every synced replica admits GPUDevice creates (§10), and each one's in-process reservations
(runtime.admission.reservations) do not see another's. So an admission of a held device under a
budget also writes its order into one ConfigMap in the operator's namespace, under the
resourceVersion it read: two replicas admitting at once cannot both write on the same version,
and the loser reads again and checks with the winner's order counted. One object for every
namespace, since a budget's selector can cover several (the in-process lock is one for all too).
The API server is the serialisation point; called by runtime.admission.validation under its
lock. An order leaves the ledger at the first write after the writer's view has its device, or
when it expires after the webhook's timeout (the device exists by then, or never will).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cozygpu.api import kinds
from cozygpu.decisions.budgets import Order
from cozygpu.kube.adapter import AlreadyExists, AsyncKube, Conflict

CONFIG_MAP = kinds.kind("ConfigMap")
NAME = "cozy-gpu-orders"
# Each attempt reads and writes once; the held-device creates of every replica take turns here.
ATTEMPTS = 20


@dataclass(frozen=True)
class Entry:
    class_name: str
    count: int
    expires: float  # wall-clock seconds: every replica reads the same entries


class Busy(Exception):
    """Every attempt lost to another replica's write: the admission fails closed, and is retried."""


class Ledger:
    def __init__(self, kube: AsyncKube, namespace: str, ttl: float, clock: Callable[[], float] = time.time) -> None:
        self._kube, self._namespace, self._ttl, self._clock = kube, namespace, ttl, clock

    async def admit(
        self,
        order: Order,
        name: str,
        seen: Callable[[str, str], bool],
        mine: Callable[[str, str], bool],
        check: Callable[[list[Order]], str | None],
    ) -> str | None:
        """`check` the order with those other admissions wrote that this replica counts nowhere yet (not `seen` in
        its view, not `mine`: reserved here); if it passes, record it under the version read, dropping what is
        seen or expired. Returns the refusal, if any; raises Busy when every attempt lost to another write."""
        for _ in range(ATTEMPTS):
            body = await self._kube.get_or_none(CONFIG_MAP, NAME, self._namespace)
            now = self._clock()
            live = {k: e for k, e in _entries(body).items() if e.expires > now and not seen(*_split(k))}
            live.pop(_key(order.namespace, name), None)
            others = [Order(ns, e.class_name, e.count, f"GPUDevice {n}") for k, e in live.items()
                      for ns, n in [_split(k)] if not mine(ns, n)]  # fmt: skip
            problem = check(others)
            if problem is not None:
                return problem
            live[_key(order.namespace, name)] = Entry(order.class_name, order.count, now + self._ttl)
            try:
                await self._write(body, live)
                return None
            except (Conflict, AlreadyExists):
                continue  # another replica wrote first: read its order and check again
        raise Busy("the held-device order ledger is busy; try again")

    async def _write(self, body: dict[str, Any] | None, entries: dict[str, Entry]) -> None:
        data = {
            k: json.dumps({"class": e.class_name, "count": e.count, "expires": e.expires}) for k, e in entries.items()
        }
        meta: dict[str, Any] = {"name": NAME, "namespace": self._namespace}
        if body is None:
            await self._kube.create(
                CONFIG_MAP, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}
            )
        else:
            meta["resourceVersion"] = body["metadata"]["resourceVersion"]
            await self._kube.replace(
                CONFIG_MAP, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}
            )


def _key(namespace: str, name: str) -> str:
    return f"{namespace}.{name}"  # a ConfigMap key ([-._a-zA-Z0-9]); namespaces hold no dot, so it splits back


def _split(key: str) -> tuple[str, str]:
    namespace, _, name = key.partition(".")
    return namespace, name


def _entries(body: dict[str, Any] | None) -> dict[str, Entry]:
    out = {}
    for name, raw in ((body or {}).get("data") or {}).items():
        try:
            value = json.loads(raw)
            out[name] = Entry(str(value["class"]), int(value["count"]), float(value["expires"]))
        except (ValueError, KeyError, TypeError):
            continue  # not ours to read: skipped, and dropped at the next write
    return out
