"""Counters as dicts that never hold a zero: the one rule the view's indexes count by.

Callers: `state.capacity` (units per node, class and namespace) and `state.budgets` (units
per budget). A key at zero is dropped, so a counter's keys are what is actually counted.
"""

from __future__ import annotations

from typing import TypeVar

K = TypeVar("K")


def add(counts: dict[K, int], key: K, units: int) -> None:
    """Add to a counter, dropping it at zero."""
    counts[key] = counts.get(key, 0) + units
    if not counts[key]:
        del counts[key]
