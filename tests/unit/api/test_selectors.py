"""Selectors and tolerations match the way Kubernetes matches them."""

from __future__ import annotations

import pytest

from cozygpu.api.selectors import LabelSelector, Toleration, selector_matches
from cozygpu.state.nodes import Taint, node_selector_matches, tolerates, untolerated


def sel(**body: object) -> LabelSelector:
    return LabelSelector.model_validate(body)


def test_no_selector_matches_everything() -> None:
    """An absent selector (no namespaceSelector on a class) entitles every namespace."""
    assert selector_matches(None, {})


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ({"matchLabels": {"tier": "gold"}}, {"tier": "gold"}, True),
        ({"matchLabels": {"tier": "gold"}}, {"tier": "silver"}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]}, {"tier": "b"}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}]}, {}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]}, {}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]}, {"tier": "a"}, False),
        ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {"gpu": ""}, True),
        ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, {"gpu": "x"}, False),
        ({}, {"anything": "x"}, True),
    ],
)
def test_label_selector(selector: dict[str, object], labels: dict[str, str], expected: bool) -> None:
    """matchLabels and every expression operator behave as metav1.LabelSelector."""
    assert selector_matches(sel(**selector), labels) is expected


def test_node_selector_needs_every_label() -> None:
    """A class's nodeSelector is a conjunction of exact label matches."""
    assert node_selector_matches({"a": "1", "b": "2"}, {"a": "1", "b": "2", "c": "3"})
    assert not node_selector_matches({"a": "1", "b": "2"}, {"a": "1"})


@pytest.mark.parametrize(
    ("toleration", "taint", "expected"),
    [
        ({"operator": "Exists"}, Taint("any", "x", "NoSchedule"), True),
        ({"key": "gpu", "operator": "Exists"}, Taint("gpu", "x", "NoExecute"), True),
        ({"key": "gpu", "value": "a10"}, Taint("gpu", "a10", "NoSchedule"), True),
        ({"key": "gpu", "value": "a10"}, Taint("gpu", "l40", "NoSchedule"), False),
        ({"key": "gpu", "value": "a10", "effect": "NoExecute"}, Taint("gpu", "a10", "NoSchedule"), False),
        ({"key": "other", "operator": "Exists"}, Taint("gpu", "", "NoSchedule"), False),
    ],
)
def test_toleration(toleration: dict[str, str], taint: Taint, expected: bool) -> None:
    """Keys, values, operators and effects are compared as core/v1 does."""
    assert tolerates(Toleration.model_validate(toleration), taint) is expected


def test_prefer_no_schedule_never_blocks() -> None:
    """Only NoSchedule and NoExecute keep a device off a node (§5.1)."""
    taints = [Taint("soft", "", "PreferNoSchedule"), Taint("hard", "", "NoSchedule")]
    assert untolerated([], taints) == [Taint("hard", "", "NoSchedule")]
