"""The chart's alerts (issue 23 item 4): unit-tested by promtool, each with its runbook, reading real figures."""

from __future__ import annotations

import subprocess

import pytest

from tests.support import monitoring


def test_the_alerts_fire_as_their_unit_tests_say() -> None:
    """`promtool test rules` over tests/monitoring/rules_test.yaml: each alert fires on its case and only then."""
    promtool = monitoring.promtool()
    if promtool is None:
        pytest.skip(monitoring.NO_PROMTOOL)
    done = subprocess.run(
        [promtool, "test", "rules", monitoring.RULE_TESTS.name],
        cwd=monitoring.RULE_TESTS.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_rule_file_is_one_prometheus_loads() -> None:
    """`promtool check rules`: the file parses, every expression is valid PromQL, every template renders."""
    promtool = monitoring.promtool()
    if promtool is None:
        pytest.skip(monitoring.NO_PROMTOOL)
    done = subprocess.run(
        [promtool, "check", "rules", str(monitoring.RULES)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_runbook_section_it_links_to() -> None:
    """A `### <alert>` section in docs/operating.md, and runbook_url pointing at its anchor there."""
    sections = monitoring.runbook_sections()
    for rule in monitoring.rules():
        name = rule["alert"]
        assert name.lower() in sections, f"docs/operating.md has no '### {name}'"
        assert rule["annotations"]["runbook_url"].endswith(f"/docs/operating.md#{name.lower()}"), name
        assert {"summary", "description"} <= set(rule["annotations"]), name
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name


def test_every_alert_is_unit_tested_firing_and_holding_still() -> None:
    """Each alert has a case in rules_test.yaml where it fires and one where it must not."""
    fired, held = set(), set()
    for case in monitoring.rule_tests()["tests"]:
        for check in case["alert_rule_test"]:
            (fired if check.get("exp_alerts") else held).add(check["alertname"])
    names = {rule["alert"] for rule in monitoring.rules()}
    assert names - fired == set(), "never seen firing"
    assert names - held == set(), "never seen holding still"


def test_the_alerts_and_dashboards_read_only_figures_the_operator_exports() -> None:
    """Every cozygpu_* name in a rule or a dashboard query is one the operator's /metrics carries."""
    exported = monitoring.exported()
    read = {name for rule in monitoring.rules() for name in monitoring.figures(rule["expr"])}
    for dashboard in monitoring.dashboards().values():
        read |= {name for _, expr in monitoring.panel_queries(dashboard) for name in monitoring.figures(expr)}
        read |= {metric for _, metric, _ in monitoring.variable_queries(dashboard)}
    assert read - exported == set()
    assert len(read) > 10
