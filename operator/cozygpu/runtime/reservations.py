"""Orders admitted but not yet seen in the view (§7.4), and the lock that serialises them.

The GPUDevice webhook admits held devices one at a time under `lock`, recording each
as a reservation until its watch event arrives (or it expires, when a later webhook
refused the create). Both the webhook and the binder count reservations as prior
orders, so no interleaving lets orders together exceed a budget. A create of a name
reserved or present is refused before it reserves (§14): a duplicate that the API server
would turn away after admission never replaces a reservation nor leaves one behind.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from cozygpu.decisions.budgets import Order


@dataclass(frozen=True)
class _Reservation:
    namespace: str
    name: str
    order: Order
    expires: float


class Reservations:
    def __init__(self, ttl: float) -> None:
        self.lock = asyncio.Lock()
        self._ttl = ttl
        self._items: dict[tuple[str, str], _Reservation] = {}

    def add(self, namespace: str, name: str, order: Order) -> None:
        self._items[(namespace, name)] = _Reservation(namespace, name, order, time.monotonic() + self._ttl)

    def holds(self, namespace: str, name: str) -> bool:
        """Whether a create of this name is admitted and not yet seen (expired ones count until `orders`)."""
        return (namespace, name) in self._items

    def seen(self, namespace: str, name: str) -> None:
        """The view has the device now: it counts there."""
        self._items.pop((namespace, name), None)

    def orders(self) -> list[Order]:
        now = time.monotonic()
        for key in [k for k, r in self._items.items() if r.expires < now]:
            del self._items[key]
        return [r.order for r in self._items.values()]
