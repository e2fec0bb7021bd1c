"""Label selectors, node selectors and tolerations, matched as Kubernetes does."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from cozygpu.api.selectors import LabelSelector, SelectorOperator, TaintEffect, Toleration, TolerationOperator
from cozygpu.state.nodes import Taint

# Only these keep a pod (or our device) off a node; PreferNoSchedule is advice.
BLOCKING_EFFECTS = frozenset({TaintEffect.NO_SCHEDULE.value, TaintEffect.NO_EXECUTE.value})


def selector_matches(selector: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics; None matches everything."""
    if selector is None:
        return True
    if any(labels.get(k) != v for k, v in selector.match_labels.items()):
        return False
    for req in selector.match_expressions:
        present = req.key in labels
        match req.operator:
            case SelectorOperator.IN:
                ok = present and labels[req.key] in req.values
            case SelectorOperator.NOT_IN:
                ok = not present or labels[req.key] not in req.values
            case SelectorOperator.EXISTS:
                ok = present
            case SelectorOperator.DOES_NOT_EXIST:
                ok = not present
        if not ok:
            return False
    return True


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
