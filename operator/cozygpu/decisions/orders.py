"""Orders (§7.1, §7.4): what an order is, which budgets record it, and how a budget's record of orders is kept.

An order is new units of a class in a namespace: a held device at its creation, a template device
at bind time. Until the view counts its device (§7.2), an order another process admitted counts
only from the record on the budgets it spends (`GPUBudget.status.orders`), which runtime.charges
writes at admission and the accountant keeps pruned. Here, free of I/O: which budgets can refuse an
order and so record it (`charging`), which recorded orders a process must still count and which
leave the record (`settle`: the accountant's count takes an order's place), and the record written
back (`recorded`). Callers: decisions.budgets,
decisions.validation, decisions.requests, runtime.charges, the accountant (decisions.usestatus).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from cozygpu.api import GPUBudget, kinds
from cozygpu.api.gpubudget import BudgetOrder, BudgetSetAside
from cozygpu.state.cluster import Cluster


@dataclass(frozen=True)
class Order:
    """`count` new units of `class_name` in `namespace`; `what` names it in messages. With `budget`, units another
    replica set aside on that budget alone: they count against it, not against the other budgets of the namespace."""

    namespace: str
    class_name: str
    count: int
    what: str
    budget: tuple[str, str] | None = None


Claim = tuple[str, str, str]  # the device an order is for: namespace, name, uid


def charged(budget: GPUBudget, class_name: str) -> bool:
    """Whether the budget can refuse an order of the class, and so records it: it limits the class or the total.
    Nothing else is written to it, so what it records never holds more units than its limits (§7.4)."""
    return class_name in budget.spec.limits or budget.spec.total is not None


def charging(cluster: Cluster, namespace: str, classes: Iterable[str]) -> list[GPUBudget]:
    """The budgets covering the namespace (§1.4) that record an order of any of these classes, by key."""
    wanted = set(classes)
    return [b for b in cluster.budgets.covering(namespace) if any(charged(b, c) for c in wanted)]


def counted(cluster: Cluster, entry: BudgetOrder) -> bool:
    """Whether the view counts the entry's device against budgets (§7.2) on the API's word, not on a decision in
    flight; a device of the name with another uid is not it (deleted and made again, perhaps with more units)."""
    device = cluster.devices.get((entry.namespace, entry.name))
    if device is None or (entry.uid and device.metadata.uid != entry.uid):
        return False
    return device.in_use and not cluster.devices.assumed(entry.namespace, entry.name)


def settle(
    cluster: Cluster,
    entries: Sequence[BudgetOrder],
    now: dt.datetime,
    mine: Callable[[str, str, str], bool],
    *,
    counting: bool = False,
) -> tuple[list[BudgetOrder], dict[Claim, Order]]:
    """What stays on a budget's record; and the orders this process counts nowhere else (not in its view, not
    among its own decisions: `mine`, its reservations).

    An entry leaves once it expired (its device never came: a create refused after the webhooks), or once this
    view saw its device go (it uses nothing now). With `counting` (the accountant, whose write sets `used` and
    `countedThrough` with it), an entry whose device this view counts leaves too, once the view's watch has
    delivered that device (its version within `progress`): `used` takes its place, and a replica whose watch is
    not that far yet counts `used` instead of its own view (`budgets.usage`)."""
    kept: list[BudgetOrder] = []
    others: dict[Claim, Order] = {}
    through = cluster.progress(kinds.GPU_DEVICE)
    for entry in entries:
        if entry.expires <= now or (entry.uid and cluster.devices.removed(entry.uid)):
            continue
        ns, name = entry.namespace, entry.name
        seen = counted(cluster, entry)
        if seen and counting and (cluster.stored_version(kinds.GPU_DEVICE, (ns, name)) or 0) <= through:
            continue
        kept.append(entry)
        if not seen and not cluster.devices.assumed(ns, name) and not mine(ns, name, entry.uid):
            others[(ns, name, entry.uid)] = Order(ns, entry.class_name, entry.count, f"GPUDevice {name}")
    return kept, others


def recorded(
    kept: Sequence[BudgetOrder], new: Mapping[Claim, Order], withdrawn: Iterable[Claim], expires: dt.datetime
) -> list[BudgetOrder]:
    """The record to write: what stays, less the orders `withdrawn` (refused on another budget after all), with
    the `new` ones (a claim recorded again is renewed). Two devices of one name racing are two claims, two orders."""
    gone = set(withdrawn) | set(new)
    out = [e for e in kept if (e.namespace, e.name, e.uid) not in gone]
    for (ns, name, uid), order in new.items():
        out.append(
            BudgetOrder(
                namespace=ns, name=name, uid=uid, class_name=order.class_name, count=order.count, expires=expires
            )
        )
    return out


def set_aside_orders(budget: GPUBudget, held: Iterable[tuple[str, str, int]]) -> dict[Claim, Order]:
    """Units set aside on the budget, given as (holder, class, units), as orders counted against it alone: one per
    holder and class, keyed apart from every device's claim."""
    namespace = budget.namespace or ""
    return {
        (namespace, f"set-aside/{budget.name}/{holder}/{class_name}", ""): Order(
            namespace, class_name, units, f"units set aside by {holder}", budget=budget.key
        )
        for holder, class_name, units in held
        if units > 0
    }


def live(entries: Iterable[BudgetSetAside], now: dt.datetime) -> list[BudgetSetAside]:
    """The set-asides that have not expired by `now`."""
    return [a for a in entries if a.expires > now]


def in_flight(entries: Iterable[BudgetOrder | BudgetSetAside]) -> int:
    """Units of the recorded orders (`status.orderedTotal`), or of the set-asides (`status.setAsideTotal`)."""
    return sum(e.count if isinstance(e, BudgetOrder) else e.units for e in entries)


def due(entries: Iterable[BudgetOrder | BudgetSetAside]) -> dt.datetime | None:
    """When the first of these entries expires, if nothing takes it off before (None: nothing recorded)."""
    return min((e.expires for e in entries), default=None)
