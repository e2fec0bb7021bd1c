"""Node selectors and tolerations, matched as Kubernetes does (label selectors: `api.selectors`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from cozygpu.api.selectors import TaintEffect, Toleration, TolerationOperator
from cozygpu.state.nodes import Taint

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
