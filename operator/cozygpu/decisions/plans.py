"""The VMI webhook's checks of a resolved set, as one pure call (§3.5-§3.9): what to write, or why not.

Called by the VMI webhook (runtime.admission.vmi_webhook) once it has read the referenced devices fresh and made
each a `Member`; before it writes anything. The rules themselves live in `decisions.admission` (the set), the
output (what the set puts on the VMI, `decisions.outputs`) and `decisions.budgets` (the orders); here they are
asked in the spec's order, and the first one broken is the refusal the tenant reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cozygpu.decisions import admission, budgets
from cozygpu.decisions.admission import Member
from cozygpu.decisions.orders import Order
from cozygpu.decisions.outputs import Entries, Output
from cozygpu.state.cluster import Cluster


@dataclass(frozen=True)
class Plan:
    """What an admission writes once the binder agrees: the VMI's entries, and the set's new orders (§3.9) by
    device name, held against the budgets until created."""

    entries: Entries
    orders: dict[str, Order]


def plan(
    cluster: Cluster,
    vmi: dict[str, Any],
    namespace: str,
    members: Sequence[Member],
    *,
    output: Output,
    prior: Sequence[Order],
    budgets_required: bool = False,
) -> Plan | str:
    """The plan, or the refusal of the first rule the set breaks: a device named twice (§3.5), the set as a whole
    (§3.6), a template no node could take (§3.7), GPU entries of the VMI's own (§3.8), the budgets (§3.9, with
    `prior`: orders admitted elsewhere and not yet in the view)."""
    permitted = admission.permitted_resources(cluster)
    problem = (
        admission.duplicates(members)
        or admission.set_problem((vmi.get("metadata") or {}).get("labels") or {}, members, permitted)
        or admission.templates_fit(cluster, members)
    )
    if problem:
        return problem
    entries = output.entries(members)
    own = output.foreign(vmi, entries, admission.gpu_resource_names(cluster, permitted))
    if own:
        return "the VMI carries GPU entries of its own next to device references: " + ", ".join(own)
    orders = admission.orders(namespace, members)
    refusal = budgets.check_orders(cluster, list(orders.values()), prior, required=budgets_required)
    if refusal:
        return refusal
    return Plan(entries, orders)
