"""Budgets and entitlements (§7): may a namespace order these units?

The webhook checks orders early (advice); the binder checks them again at bind time,
one decision at a time, which is the guarantee (§7.4).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cozygpu.api import GPUBudget, GPUDevice, kinds
from cozygpu.api.selectors import selector_matches
from cozygpu.decisions.orders import Order
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
        for budget in budgets:
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
        for budget in covering_budgets(cluster, order.namespace):
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
