"""The node pin: a required node-affinity term naming one node, on a VMI's or a pod's spec.

One rule for both callers: the VMI webhook pins the VMI (informative, §3) and the
pod webhook pins every pod rendered for it (the pin that holds, §12.2). kube-scheduler
honours `matchFields` on `metadata.name`; adding it to every required term keeps
whatever the terms already demand and makes each of them name the node.
"""

from __future__ import annotations

import copy
from typing import Any


def _pin(node: str) -> dict[str, Any]:
    return {"key": "metadata.name", "operator": "In", "values": [node]}


def pinned_spec(spec: dict[str, Any], node: str) -> dict[str, Any]:
    """A copy of the spec whose every required node-affinity term names `node` (one made when none)."""
    out = copy.deepcopy(spec)
    required = (
        out.setdefault("affinity", {})
        .setdefault("nodeAffinity", {})
        .setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    )
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        fields = term.setdefault("matchFields", [])
        if _pin(node) not in fields:
            fields.append(_pin(node))
    return out


def is_pinned(spec: dict[str, Any], node: str) -> bool:
    """Whether every required term already names the node (nothing to add)."""
    terms = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
        or {}
    ).get("nodeSelectorTerms") or []
    return bool(terms) and all(_pin(node) in (t.get("matchFields") or []) for t in terms)
