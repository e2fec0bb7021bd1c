"""The layout's rules that imports cannot express (§13: one door into the view)."""

from __future__ import annotations

import re
from pathlib import Path

import cozygpu.runtime

RUNTIME = Path(cozygpu.runtime.__file__).parent
# Storing into or removing from the view, as the cluster's own methods spell it.
_CHANGES_VIEW = re.compile(r"\b(cluster|_cluster)\.(apply|upsert_\w+|remove_\w+)\(")
# An adapter write of one of the kinds the view holds.
_WRITES_OUR_KINDS = re.compile(r"_kube\.(create|replace|replace_status|patch|delete)\(kinds\.GPU_")


def offenders(pattern: re.Pattern[str], allowed: str) -> list[str]:
    """Lines of runtime modules other than `allowed` that match `pattern`, as file:line."""
    return [
        f"{path.name}:{n}"
        for path in sorted(RUNTIME.glob("*.py"))
        if path.name != allowed
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]


def test_only_the_door_changes_the_view() -> None:
    """Every worker's writes reach the view through runtime.view (via runtime.writes), never by hand."""
    assert offenders(_CHANGES_VIEW, "view.py") == []


def test_only_the_writer_writes_the_views_kinds() -> None:
    """Workers write GPUDevices, GPUClasses, GPUBudgets and GPUNodes through runtime.writes, whose response
    goes into the view; a direct adapter write would leave the view behind the API."""
    assert offenders(_WRITES_OUR_KINDS, "writes.py") == []


# A fresh adapter read of one of the kinds the view holds (ours, and the VMIs the webhook reads).
_READS_OUR_KINDS = re.compile(r"kube\.(get|get_or_none|list)\(kinds\.(GPU_|VMI\b)")


def test_only_the_writer_reads_the_views_kinds_fresh() -> None:
    """Issue 20 item 4: a fresh read goes through `Writer.read`, so what it finds reaches the view too."""
    assert offenders(_READS_OUR_KINDS, "writes.py") == []
