"""The chart's monitoring sources as the tests read them: alert rules, dashboards and their queries (issue 23).

`rules()` are the alerts of files/prometheus-rules.yaml; `dashboards()` the JSON of files/dashboards;
`panel_queries` every query a dashboard's panels run, and `grafana` what Grafana sends Prometheus for one:
template variables replaced as "All" replaces them (their allValue), Grafana's own interval variables by the
range the test says. `exported()` are the names the operator's /metrics can carry.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.metrics_core import Metric

from cozygpu.devcluster.binaries import repo_root
from cozygpu.runtime.metrics import Metrics
from cozygpu.state.cluster import Cluster

CHART = repo_root() / "charts" / "cozy-gpu-operator"
RULES = CHART / "files" / "prometheus-rules.yaml"
DASHBOARDS = CHART / "files" / "dashboards"
RULE_TESTS = repo_root() / "tests" / "monitoring" / "rules_test.yaml"
OPERATING = repo_root() / "docs" / "operating.md"
FIGURE = re.compile(r"\bcozygpu_[a-z_]+")
NO_PROMTOOL = "promtool is not installed (Debian's prometheus package; .ci/run installs it)"
NO_PROMETHEUS = "prometheus is not installed (Debian's prometheus package; .ci/run installs it)"


def promtool() -> str | None:
    return shutil.which("promtool")


def rules() -> list[dict[str, Any]]:
    """Every alerting rule of the chart's rule file, over its groups."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def dashboards() -> dict[str, dict[str, Any]]:
    """The chart's dashboards by file name."""
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # a collapsed row keeps its panels inside


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title and refId, expression) of every target of every panel, rows' panels included."""
    return [
        (f"{panel['title']} [{target['refId']}]", target["expr"])
        for panel in _panels(dashboard["panels"])
        for target in panel.get("targets", [])
    ]


def variable_queries(dashboard: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(variable, metric, label) of each `label_values(metric, label)` template variable."""
    found = []
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"] if isinstance(variable["query"], str) else variable["query"]["query"]
        match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query)
        assert match, f"{variable['name']}: {query} is not label_values(metric, label)"
        found.append((variable["name"], match[1], match[2]))
    return found


def grafana(dashboard: dict[str, Any], expr: str, rate_interval: str) -> str:
    """The query Grafana sends with every variable at "All" and `$__rate_interval` (and `$__interval`) set."""
    out = expr.replace("$__rate_interval", rate_interval).replace("${__rate_interval}", rate_interval)
    out = out.replace("$__interval", rate_interval)
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            name, value = variable["name"], variable["allValue"]
            out = re.sub(rf"\$\{{{name}\}}|\${name}\b", lambda _, v=value: v, out)
    assert "$" not in out, f"a variable left in {out}"
    return out


def figures(expr: str) -> set[str]:
    """The operator's metric names an expression reads."""
    return set(FIGURE.findall(expr))


def exported() -> set[str]:
    """Every sample name the operator's /metrics can carry, histograms' and counters' suffixes included."""
    names: set[str] = set()
    family: Metric
    for family in Metrics(Cluster()).registry.collect():
        names.add(family.name)
        suffixes = {"histogram": ("_bucket", "_count", "_sum"), "counter": ("_total",)}.get(family.type, ())
        names |= {family.name + s for s in suffixes}
    return names


def runbook_sections() -> set[str]:
    """The level-3 headings of docs/operating.md, as GitHub makes their anchors (lower case here)."""
    return {m[1].strip().lower() for m in re.finditer(r"^### (.+)$", OPERATING.read_text(), flags=re.M)}


def rule_tests() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(Path(RULE_TESTS).read_text())
    return loaded
