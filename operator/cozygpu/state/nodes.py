"""A Node as the decisions see it: labels, taints, readiness and GPU allocatable; node selectors and
tolerations matched against it as Kubernetes matches them (label selectors: `api.selectors`)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cozygpu.api.pods import BadQuantity, is_extended, units
from cozygpu.api.selectors import TaintEffect, Toleration, TolerationOperator

_PLAIN_INT = re.compile(r"^\d+$")


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class NodeInfo:
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    ready: bool = False
    unschedulable: bool = False
    # Only whole-number quantities: device-plugin resources are always counts.
    allocatable: dict[str, int] = field(default_factory=dict)
    resource_version: str = ""

    def units(self, resource: str) -> int:
        """§8.1: served units of a resource = allocatable while the node exists."""
        return self.allocatable.get(resource, 0)

    def free(self, resource: str, held: int) -> int:
        """§5.1: allocatable minus held, never below zero: a node that lost capacity takes nothing new."""
        return max(0, self.units(resource) - held)


def _allocatable(quantities: dict[str, Any]) -> dict[str, int]:
    """Whole counts; an extended resource's in any form the API server writes it (1000 reads back as "1k")."""
    out = {}
    for resource, value in quantities.items():
        if not isinstance(value, str):
            continue
        if _PLAIN_INT.match(value):
            out[resource] = int(value)
        elif is_extended(resource):
            with contextlib.suppress(BadQuantity):
                out[resource] = units(value)
    return out


def node_info(body: dict[str, Any]) -> NodeInfo:
    meta = body.get("metadata", {})
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    conditions = status.get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    allocatable = _allocatable(status.get("allocatable") or {})
    taints = tuple(
        Taint(t.get("key", ""), t.get("value", "") or "", t.get("effect", "")) for t in spec.get("taints") or []
    )
    return NodeInfo(
        name=meta.get("name", ""),
        labels=dict(meta.get("labels") or {}),
        taints=taints,
        ready=ready,
        unschedulable=bool(spec.get("unschedulable")),
        allocatable=allocatable,
        resource_version=meta.get("resourceVersion", ""),
    )


# Only these keep a pod (or our device) off a node; PreferNoSchedule is advice.
BLOCKING_EFFECTS = frozenset({TaintEffect.NO_SCHEDULE.value, TaintEffect.NO_EXECUTE.value})


def node_selector_matches(node_selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in node_selector.items())


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    if toleration.effect is not None and toleration.effect.value != taint.effect:
        return False
    if toleration.operator is TolerationOperator.EXISTS:
        return toleration.key in (None, "", taint.key)
    return toleration.key == taint.key and (toleration.value or "") == taint.value


def untolerated(tolerations: Iterable[Toleration], taints: Iterable[Taint]) -> list[Taint]:
    """The blocking taints that no toleration covers."""
    tols = list(tolerations)
    return [t for t in taints if t.effect in BLOCKING_EFFECTS and not any(tolerates(tol, t) for tol in tols)]
