"""Orders admitted but not yet seen in the view (§7.4).

The GPUDevice webhook checks a held device and reserves it with no await between, recording
each as a reservation until its watch event arrives (or it expires, when a later webhook
refused the create). The VMI webhook holds its template orders the same way from its early
budget check until their devices are created (`holding`). Both webhooks and the binder count
reservations as prior orders, so no interleaving lets orders together exceed a budget. A create of a name
reserved or present is refused before it reserves (§14): a duplicate that the API server
would turn away after admission never replaces a reservation nor leaves one behind.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from cozygpu.decisions.orders import Order
from cozygpu.state.cluster import Change
from cozygpu.state.counts import add as add_count


@dataclass(frozen=True)
class _Reservation:
    namespace: str
    name: str
    order: Order
    expires: float
    uid: str = ""  # the device's, from the review: another create of the name is another order


class Reservations:
    """Reservations keyed by the admission that made them (the review's uid): two admissions never share one, so
    orders only add up; and by name, for the duplicate check and for the view's sighting."""

    def __init__(self, ttl: float) -> None:
        self._ttl = ttl
        # In the order they expire (one ttl for all): the expired are taken off the front.
        self._items: dict[str, _Reservation] = {}
        self._by_name: dict[tuple[str, str], set[str]] = {}
        # Units reserved per (namespace, class): what every decision counts, kept as reservations come and go.
        self._units: dict[tuple[str, str], int] = {}
        self._unnamed = itertools.count()

    def add(self, namespace: str, name: str, order: Order, *, review: str = "", uid: str = "") -> str:
        """Reserve `order` for the admission `review` (a made-up key where there is none: tests, direct calls);
        returns the reservation's key."""
        key = review or f"unnamed-{next(self._unnamed)}"
        self._drop(key)
        self._items[key] = _Reservation(namespace, name, order, time.monotonic() + self._ttl, uid)
        self._by_name.setdefault((namespace, name), set()).add(key)
        add_count(self._units, (order.namespace, order.class_name), order.count)
        return key

    @contextlib.contextmanager
    def holding(self, namespace: str, orders: Mapping[str, Order]) -> Iterator[None]:
        """Reserve orders by device name while the block runs: a VMI's template orders, from the early budget check
        until their devices are created (each leaves as the view sees it; the rest when the block ends)."""
        keys = [self.add(namespace, name, order) for name, order in orders.items()]
        try:
            yield
        finally:
            for key in keys:
                self.cancel(key)

    def cancel(self, key: str) -> None:
        """The admission that reserved under `key` refused after all: its order never counts."""
        self._drop(key)

    def holds(self, namespace: str, name: str) -> bool:
        """Whether a create of this name is admitted and not yet seen (expired ones count until `orders`)."""
        return (namespace, name) in self._by_name

    def holds_device(self, namespace: str, name: str, uid: str) -> bool:
        """Whether the order for the device of this uid is reserved here (the order ledger's `mine`): a create of the
        same name racing on another replica is another device, another order (§14)."""
        return any(self._items[k].uid == uid or not uid for k in self._by_name.get((namespace, name), ()))

    def changed(self, change: Change) -> None:
        """The view's change of a device (it subscribes to them): one it has now counts there."""
        if not change.deleted:
            self.seen(change.namespace, change.name)

    def seen(self, namespace: str, name: str) -> None:
        """The view has the device now: it counts there."""
        for key in list(self._by_name.get((namespace, name), ())):
            self._drop(key)

    def orders(self, excluding: str = "") -> list[Order]:
        """Every live reservation's order, but the one under `excluding` (the admission asking)."""
        self._expire()
        return [r.order for k, r in self._items.items() if k != excluding]

    def prior(self, excluding: str = "") -> list[Order]:
        """What `orders` holds, as budgets count it: one order per namespace and class, its units summed. Each
        decision counts these (§7.4), so the work is the lines reserved, not the reservations (a burst's many)."""
        self._expire()
        skip = self._items.get(excluding)
        less = {} if skip is None else {(skip.order.namespace, skip.order.class_name): skip.order.count}
        return [
            Order(line[0], line[1], units - less.get(line, 0), f"orders reserved in namespace {line[0]}")
            for line, units in self._units.items()
            if units > less.get(line, 0)
        ]

    def _expire(self) -> None:
        now = time.monotonic()
        while self._items:
            key, oldest = next(iter(self._items.items()))
            if oldest.expires >= now:
                return
            self._drop(key)

    def _drop(self, key: str) -> None:
        old = self._items.pop(key, None)
        if old is None:
            return
        add_count(self._units, (old.order.namespace, old.order.class_name), -old.order.count)
        keys = self._by_name.get((old.namespace, old.name), set())
        keys.discard(key)
        if not keys:
            self._by_name.pop((old.namespace, old.name), None)
