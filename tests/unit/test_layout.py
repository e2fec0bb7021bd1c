"""The layout's rules that imports cannot express (§13: one door into the view)."""

from __future__ import annotations

import re
from pathlib import Path

import cozygpu.runtime

RUNTIME = Path(cozygpu.runtime.__file__).parent
# Storing into or removing from the view, as the cluster's own methods spell it.
_CHANGES_VIEW = re.compile(r"\b(cluster|_cluster)\.(apply|upsert_\w+|remove_\w+)\(")


def test_only_the_door_changes_the_view() -> None:
    """Every worker's writes reach the view through runtime.view (via runtime.writes), never by hand."""
    offenders = [
        f"{path.name}:{n}"
        for path in sorted(RUNTIME.glob("*.py"))
        if path.name != "view.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if _CHANGES_VIEW.search(line)
    ]
    assert offenders == []


def test_only_the_writer_writes_the_views_kinds() -> None:
    """Workers write GPUDevices, GPUClasses, GPUBudgets and GPUNodes through runtime.writes, whose response
    goes into the view; a direct adapter write would leave the view behind the API."""
    direct = re.compile(r"_kube\.(create|replace|replace_status|patch|delete)\(kinds\.GPU_")
    offenders = [
        f"{path.name}:{n}"
        for path in sorted(RUNTIME.glob("*.py"))
        if path.name != "writes.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if direct.search(line)
    ]
    assert offenders == []
