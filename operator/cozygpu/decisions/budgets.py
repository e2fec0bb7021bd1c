"""Budgets and entitlements (§7): may a namespace order these units?

The webhook checks orders early (advice); the binder checks them again at bind time,
one decision at a time, which is the guarantee (§7.4).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from cozygpu.api import GPUBudget, GPUDevice, kinds
from cozygpu.api.selectors import selector_matches
from cozygpu.decisions.orders import Order, charged, set_aside_orders
from cozygpu.state.cluster import Cluster
from cozygpu.state.tombstones import version


def covering_budgets(cluster: Cluster, namespace: str) -> list[GPUBudget]:
    """§1.4: budgets of the namespace itself and those whose namespaceSelector matches it (the view's index)."""
    return cluster.budgets.covering(namespace)


def counts(device: GPUDevice) -> bool:
    """§7.2: whether the device counts against budgets (`GPUDevice.in_use`)."""
    return device.in_use


def usage(cluster: Cluster, budget: GPUBudget) -> dict[str, int]:
    """Units counting against the budget in the namespaces it covers, per class (the view's counters), or, where
    this view's watch of devices is behind the count the budget shows (`countedThrough`), that count where it is
    more: the accountant let orders go once `used` had their devices, and this view may not have them yet (§7.4).

    The budget is the view's own (looked up by its key): what it covers is what the view stored."""
    used = cluster.budgets.use(*budget.key)
    if cluster.progress(kinds.GPU_DEVICE) < version(budget.status.counted_through):
        for class_name, units in budget.status.used.items():
            used[class_name] = max(used.get(class_name, 0), units)
    return used


def entitled(cluster: Cluster, namespace: str, class_name: str) -> bool:
    """§1.1: no namespaceSelector means every namespace is entitled."""
    cls = cluster.classes.get(class_name)
    return cls is not None and selector_matches(cls.spec.namespace_selector, cluster.namespace_labels(namespace))


def check_orders(
    cluster: Cluster, orders: Sequence[Order], prior: Sequence[Order] = (), *, required: bool = False
) -> str | None:
    """§7.1: every order in turn, each counting the ones before it; the first refusal, or None.

    `prior` are orders admitted but not yet in the view (held devices just created): they
    count, but are not checked again. `required`: a namespace no budget covers orders nothing
    (otherwise it may order every free GPU; docs/security.md)."""
    used: dict[tuple[str, str], dict[str, int]] = {}
    covering: dict[str, list[GPUBudget]] = {}  # one look-up per namespace, however many orders it has
    for order in prior:
        budgets = covering.get(order.namespace)
        if budgets is None:
            budgets = covering[order.namespace] = covering_budgets(cluster, order.namespace)
        for budget in _spent(budgets, order):
            tally = used.setdefault(budget.key, usage(cluster, budget))
            tally[order.class_name] = tally.get(order.class_name, 0) + order.count
    for order in orders:
        if not entitled(cluster, order.namespace, order.class_name):
            return f"{order.what}: namespace {order.namespace} is not entitled to GPUClass {order.class_name}"
        budgets = covering_budgets(cluster, order.namespace)
        if required and not budgets:
            return f"{order.what}: namespace {order.namespace} has no GPUBudget, and this cluster requires one"
        for budget in budgets:
            key = budget.key
            tally = used.setdefault(key, usage(cluster, budget))
            limit = budget.spec.limits.get(order.class_name)
            after = tally.get(order.class_name, 0) + order.count
            if limit is not None and after > limit:
                return (
                    f"{order.what}: GPUBudget {key[0]}/{key[1]} allows {limit} units of GPUClass "
                    f"{order.class_name} and {tally.get(order.class_name, 0)} are in use; "
                    f"{order.count} more would exceed it"
                )
            total = sum(tally.values())
            if budget.spec.total is not None and total + order.count > budget.spec.total:
                return (
                    f"{order.what}: GPUBudget {key[0]}/{key[1]} allows {budget.spec.total} units in total "
                    f"and {total} are in use; {order.count} more would exceed it"
                )
        for budget in budgets:
            tally = used[budget.key]
            tally[order.class_name] = tally.get(order.class_name, 0) + order.count
    return None


def _spent(budgets: list[GPUBudget], order: Order) -> list[GPUBudget]:
    """Of the budgets covering an order's namespace, those it counts against: all, or the one it was set aside on."""
    return budgets if order.budget is None else [b for b in budgets if b.key == order.budget]


def room(cluster: Cluster, budget: GPUBudget, class_name: str, counted: Iterable[Order]) -> int:
    """Units of the class an order could still take on the budget, after its use and the `counted` orders (those
    of namespaces it covers, and those set aside on it): the least its class limit and its total leave."""
    tally = dict(usage(cluster, budget))
    covers: dict[str, bool] = {}
    for order in counted:
        if order.budget is not None:
            if order.budget != budget.key:
                continue
        else:
            if order.namespace not in covers:
                covers[order.namespace] = any(b.key == budget.key for b in covering_budgets(cluster, order.namespace))
            if not covers[order.namespace]:
                continue
        tally[order.class_name] = tally.get(order.class_name, 0) + order.count
    left: list[int] = []
    if (limit := budget.spec.limits.get(class_name)) is not None:
        left.append(limit - tally.get(class_name, 0))
    if budget.spec.total is not None:
        left.append(budget.spec.total - sum(tally.values()))
    return max(0, min(left, default=0))


# How long a replica admits within units it set aside before it writes them again (or, unused, lets them go).
WINDOW = dt.timedelta(seconds=5)
# One replica sets aside at most this share of what a budget has left, so another racing it for the last units
# finds most of them free, and its own set-aside shrinks as the budget fills.
SHARE = 4


@dataclass(frozen=True)
class Held:
    """Units a replica set aside on a budget for a class as its last write recorded them, how many of them it has
    admitted orders within since, and when they expire."""

    units: int
    taken: int
    expires: dt.datetime


def set_aside(
    cluster: Cluster,
    budget: GPUBudget,
    held: Mapping[str, Held],
    admitted: Iterable[str],
    counted: Sequence[Order],
    *,
    now: dt.datetime,
    ttl: dt.timedelta,
    most: int,
    window: dt.timedelta = WINDOW,
) -> dict[str, tuple[int, dt.datetime]]:
    """A replica's set-asides on the budget after its write (§7.4): units per class and when they expire.

    For a class it admitted in (`admitted`, or within what it `held`), a share of what the budget has left once the
    `counted` orders are (`room`: every order but those within its own set-asides), and never less than its set-aside
    still holds, which it may admit within while the write is in flight; they are usable for `window`, then stay
    charged `ttl` more, as an order written on its own would. One unused whose time is up goes; one unused still in
    its time stays as it is. None where `most` is 0 or the budget cannot refuse the class (it records nothing)."""
    out: dict[str, tuple[int, dt.datetime]] = {}
    wanted = set(admitted)
    # What this replica holds of each class meanwhile: a class not decided yet at least its unused units.
    mine = {c: h.units - h.taken for c, h in held.items()}
    for class_name in sorted(wanted | held.keys()):
        got = held.get(class_name)
        mine.pop(class_name, None)
        if not most or not charged(budget, class_name):
            continue
        if got is not None and got.taken == 0 and class_name not in wanted:
            if got.expires - ttl > now:
                out[class_name] = (got.units, got.expires)
                mine[class_name] = got.units
            continue
        left = got.units - got.taken if got is not None else 0
        # A total spans classes: the units this replica sets aside for its other classes leave no room for this one.
        elsewhere = set_aside_orders(budget, (("this replica", c, n) for c, n in mine.items())).values()
        units = max(min(most, room(cluster, budget, class_name, [*counted, *elsewhere]) // SHARE), left)
        if units > 0:
            out[class_name] = (units, now + ttl + window)
            mine[class_name] = units
    return out


@dataclass(frozen=True)
class Overrun:
    why: str
    classes: frozenset[str] | None  # the classes over their limits; None: the total is over, every class adds to it

    def fed_by(self, orders: Iterable[Order]) -> bool:
        return any(self.classes is None or o.class_name in self.classes for o in orders)


def overrun(cluster: Cluster, extra: Sequence[Order], namespaces: Iterable[str] = ()) -> dict[tuple[str, str], Overrun]:
    """Budgets covering `namespaces` or an order of `extra` (orders the view does not count yet) that the view's use
    plus `extra` exceeds, each with why and by which classes.

    The binder's second look at orders it has already counted (§7.4 across replicas): what it decided is in the
    view, and since then other replicas' orders reached the view or only the budgets' records (`extra`). Only counts, no
    entitlement: the orders were admitted already, and an overrun is settled by taking back the newest of ours."""
    tallies: dict[tuple[str, str], tuple[GPUBudget, dict[str, int]]] = {}
    for namespace in namespaces:
        for budget in covering_budgets(cluster, namespace):
            tallies.setdefault(budget.key, (budget, dict(usage(cluster, budget))))
    for order in extra:
        for budget in _spent(covering_budgets(cluster, order.namespace), order):
            key = budget.key
            _, tally = tallies.setdefault(key, (budget, dict(usage(cluster, budget))))
            tally[order.class_name] = tally.get(order.class_name, 0) + order.count
    out: dict[tuple[str, str], Overrun] = {}
    for (ns, name), (budget, tally) in tallies.items():
        over = [c for c, n in sorted(tally.items()) if (limit := budget.spec.limits.get(c)) is not None and n > limit]
        total, used = budget.spec.total, sum(tally.values())
        classes: frozenset[str] | None = frozenset(over)
        if over:
            allows, use = f"{budget.spec.limits[over[0]]} units of GPUClass {over[0]}", tally[over[0]]
        elif total is not None and used > total:
            allows, use, classes = f"{total} units in total", used, None
        else:
            continue
        why = f"GPUBudget {ns}/{name} allows {allows}, and {use} would be in use with orders admitted elsewhere"
        out[(ns, name)] = Overrun(why, classes)
    return out
