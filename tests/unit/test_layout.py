"""The layout's rules that imports cannot express (§13: one door into the view)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping, MutableMapping
from pathlib import Path
from typing import Any

import cozygpu
import cozygpu.runtime
from cozygpu.state.cluster import Cluster

PACKAGE = Path(cozygpu.__file__).parent
RUNTIME = Path(cozygpu.runtime.__file__).parent
# The view's own package, and its one door: the only code that may touch what the view keeps privately.
INSIDE = ("state/", "runtime/view.py")
# An adapter write of one of the kinds the view holds.
_WRITES_OUR_KINDS = re.compile(r"_kube\.(create|replace|replace_status|patch|delete)\(kinds\.GPU_")


def offenders(pattern: re.Pattern[str], allowed: str) -> list[str]:
    """Lines of runtime modules other than `allowed` that match `pattern`, as file:line."""
    return [
        f"{path.name}:{n}"
        for path in sorted(RUNTIME.rglob("*.py"))
        if path.name != allowed
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]


def _view_objects(obj: Any, seen: set[int] | None = None) -> Iterator[Any]:
    """The cluster and every object of the view it is made of (the parts in cozygpu.state)."""
    seen = set() if seen is None else seen
    if id(obj) in seen or not type(obj).__module__.startswith("cozygpu.state"):
        return
    seen.add(id(obj))
    yield obj
    for value in vars(obj).values():
        yield from _view_objects(value, seen)


def _private_names() -> set[str]:
    """What the view's objects keep privately: their private attributes and private methods."""
    names: set[str] = set()
    for obj in _view_objects(Cluster()):
        names |= {n for n in vars(obj) if n.startswith("_") and not n.startswith("__")}
        names |= {n for klass in type(obj).__mro__ for n in vars(klass) if n.startswith("_") and not n.startswith("__")}
    return names


def private_reaches(source: str, private: set[str]) -> list[str]:
    """Attribute accesses in `source` that reach another object's private name of the view (not `self`'s)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        own = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
        if isinstance(node, ast.Attribute) and node.attr in private and not own:
            out.append(f"{node.lineno}: {ast.unparse(node)}")
    return out


def side_doors_in_modules() -> list[str]:
    private = _private_names()
    return [
        f"{path.relative_to(PACKAGE).as_posix()}:{hit}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if not path.relative_to(PACKAGE).as_posix().startswith(INSIDE)
        for hit in private_reaches(path.read_text(), private)
    ]


def writers_on_the_surface(cluster: Any) -> list[str]:
    """Public attributes of the cluster (and of the objects it hands out) that could change the view."""
    out = []
    for name in dir(cluster):
        if name.startswith("_"):
            continue
        value = getattr(cluster, name)
        if getattr(getattr(value, "__func__", value), "__writes__", False):
            out.append(f"{name}: a method that writes")
        elif isinstance(value, (MutableMapping, list, set)):
            out.append(f"{name}: a mutable {type(value).__name__}")
        elif type(value).__module__.startswith("cozygpu.state") or not (isinstance(value, Mapping) or callable(value)):
            # A part's read side (a mapping itself, some of them) is walked as the cluster is.
            out.extend(f"{name}.{inner}" for inner in writers_on_the_surface(value))
    return out


def test_only_the_door_reaches_what_the_view_keeps_privately() -> None:
    """Outside state/ and runtime/view.py no module touches the view's private mutators or parts (§13)."""
    assert side_doors_in_modules() == []


def test_the_guard_sees_a_side_door() -> None:
    """The guard above fails on the side doors a worker could try: the view's private state, a part, a part's index."""
    private = _private_names()
    door = "self._cluster._progress.clear()\ncluster._devices.put(key, d)\nc._capacity._by_free.clear()"
    assert private_reaches(door, private) == [
        "1: self._cluster._progress",
        "2: cluster._devices",
        "3: c._capacity._by_free",
        "3: c._capacity",
    ]
    assert private_reaches("self._apply(body)\nos._exit(75)", private) == []


def test_the_views_public_surface_only_reads() -> None:
    """Workers and decisions get a `Cluster`: every public attribute is a read or a read-only mapping."""
    assert writers_on_the_surface(Cluster()) == []


def test_the_surface_check_sees_a_writer_handed_out() -> None:
    """A part's writer or a mutable index put on the surface (a side door) is what the check reports."""
    c = Cluster()
    c.put_device = c._devices.put  # type: ignore[attr-defined]
    c.index = {}  # type: ignore[attr-defined]
    c.devices.pop = c._devices.pop  # type: ignore[attr-defined]
    assert sorted(writers_on_the_surface(c)) == [
        "devices.pop: a method that writes",
        "index: a mutable dict",
        "put_device: a method that writes",
    ]


def test_only_the_door_holds_the_write_side() -> None:
    """No module but runtime/view.py (the door) imports the view's write side, `state.indexers` (§13)."""
    importers = [
        path.relative_to(PACKAGE).as_posix()
        for path in sorted(PACKAGE.rglob("*.py"))
        if not path.relative_to(PACKAGE).as_posix().startswith("state/")
        and re.search(r"^\s*(from|import) cozygpu\.state(\.indexers| import .*\bindexers\b)", path.read_text(), re.M)
    ]
    assert importers == ["runtime/view.py"]


def test_only_the_writer_writes_the_views_kinds() -> None:
    """Workers write GPUDevices, GPUClasses, GPUBudgets and GPUNodes through runtime.writes, whose response
    goes into the view; a direct adapter write would leave the view behind the API."""
    assert offenders(_WRITES_OUR_KINDS, "writes.py") == []


# A fresh adapter read of one of the kinds the view holds (ours, and the VMIs the webhook reads).
_READS_OUR_KINDS = re.compile(r"kube\.(get|get_or_none|list)\(kinds\.(GPU_|VMI\b)")


def test_only_the_writer_reads_the_views_kinds_fresh() -> None:
    """Issue 20 item 4: a fresh read goes through `Writer.read`, so what it finds reaches the view too."""
    assert offenders(_READS_OUR_KINDS, "writes.py") == []


# A module's size follows its concept (issue 35 item 7): past this many lines its docstring says why it is one.
LONG = 400
WHY_ONE = "Why one module:"


def test_a_long_module_says_why_it_is_one_concept() -> None:
    """Issue 35 item 7: no module fails for its length, but one past 400 lines says in its docstring why it is
    one concept (a paragraph starting "Why one module:"), so a reader knows whether to split it or to read on."""
    silent = sorted(
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*.py")
        if len((text := p.read_text()).splitlines()) > LONG
        and WHY_ONE not in (ast.get_docstring(ast.parse(text)) or "")
    )
    assert silent == []


def test_the_formatter_owns_the_layout() -> None:
    """Issue 35 item 7: no `# fmt: skip` anywhere in the code (operator, tests, benches, hack): code compressed by
    hand against the formatter reads worse and hid how large modules had grown."""
    root = PACKAGE.parent.parent
    marker = "# fmt: " + "skip"
    skipped = [
        f"{path.relative_to(root)}:{n}"
        for folder in ("operator", "tests", "bench", "hack")
        for path in sorted((root / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if line.rstrip().endswith(marker)
    ]
    assert skipped == []


def test_the_cli_loads_no_control_plane_until_it_starts_one() -> None:
    """Issue 35 item 8: `cozygpu run` in a cluster never starts a control plane, so importing the CLI loads none of
    its tooling (certificates, binaries, KubeVirt); only `cozygpu dev-cluster` does."""
    probe = "import sys, cozygpu.cli; print(sorted(m for m in sys.modules if m.startswith('cozygpu.devcluster.')))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert "cozygpu.devcluster.controlplane" not in loaded and "cozygpu.devcluster.kubevirt" not in loaded
