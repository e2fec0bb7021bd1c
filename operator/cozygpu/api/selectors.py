"""Kubernetes selector and toleration shapes used by GPUClass and GPUBudget.

Only the shapes live here; matching them against nodes and namespaces is a
decision and lives with the decisions.
"""

from __future__ import annotations

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
