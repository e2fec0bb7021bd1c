"""The invariants every reliability scenario checks, read from the API server (issue 12, §3-§7).

One checker for all scenarios: no node holds more than it has, no attachment to a VMI that
does not exist, no template device without its VMI, no bind request left unanswered. Called
once the operator has had a grace period and a sweep to clear what a crash left.
"""

from __future__ import annotations

from collections import defaultdict

from cozygpu.api import kinds
from cozygpu.kube.adapter import Kube
from tests.helpers import stale


def over_allocated(kube: Kube) -> list[str]:
    """Nodes whose Bound devices hold more units of a resource than the node has."""
    classes = {c["metadata"]["name"]: c["spec"]["resourceName"] for c in kube.list(kinds.GPU_CLASS)}
    held: dict[tuple[str, str], int] = defaultdict(int)
    for d in kube.list(kinds.GPU_DEVICE):
        status = d.get("status") or {}
        resource = classes.get(d["spec"]["className"])
        if status.get("phase") == "Bound" and resource is not None:
            held[(status["nodeName"], resource)] += d["spec"].get("count", 1)
    allocatable = {n["metadata"]["name"]: n.get("status", {}).get("allocatable", {}) for n in kube.list(kinds.NODE)}
    return [
        f"node {node}: {units} of {resource} held, {allocatable.get(node, {}).get(resource, '0')} allocatable"
        for (node, resource), units in sorted(held.items())
        if node in allocatable and units > int(allocatable[node].get(resource, "0"))
    ]


def violations(kube: Kube, namespace: str) -> list[str]:
    """Every invariant broken now, in words; empty when all hold."""
    return over_allocated(kube) + stale(kube, namespace)
