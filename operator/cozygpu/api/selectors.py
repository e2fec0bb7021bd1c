"""Kubernetes selector and toleration shapes used by GPUClass and GPUBudget.

The shapes live here, and so does a label selector's meaning (`selector_matches`):
the view indexes budgets by the namespaces they select (`state.budgets`), below the
decisions. Matching nodes and taints is a decision and lives with the decisions.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from pydantic import Field

from cozygpu.api.meta import Model


class SelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class LabelSelectorRequirement(Model):
    key: str = Field(min_length=1)
    operator: SelectorOperator
    values: list[str] = Field(default_factory=list)


class LabelSelector(Model):
    """metav1.LabelSelector: every matchLabels pair and every expression must hold."""

    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list)


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


class TolerationOperator(StrEnum):
    EXISTS = "Exists"
    EQUAL = "Equal"


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class Toleration(Model):
    """core/v1 Toleration: an empty key with Exists tolerates every taint."""

    key: str | None = None
    operator: TolerationOperator = TolerationOperator.EQUAL
    value: str | None = None
    effect: TaintEffect | None = None
    toleration_seconds: int | None = None
