"""The chart's dashboard (issue 23 item 5) against a real Prometheus scraping a real operator.

Prometheus (Debian's package) scrapes the operator every second with a scraper's token, as the chart's
ServiceMonitor does by default (`auth: secret`): the operator keeps /metrics behind its TokenReview and
SubjectAccessReview check, so the test also proves the documented scrape configuration passes it. Tenants then
hold GPUs, one device waits for room, VMIs are admitted, bound and refused, and a budget is used; every panel's
query, with Grafana's variables at "All" and `$__rate_interval` at 5m, must return data, and every template
variable's label_values(...) must list values. Prometheus loads the chart's alert rules too: each evaluates
without an error against the real series.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cozygpu.api import kinds
from cozygpu.devcluster import prometheus as server
from cozygpu.kube.adapter import ApiError, Kube
from tests.support import monitoring
from tests.support.bodies import budget_body, gpu_device_body, vmi_body
from tests.support.harness import OperatorProcess, wait_for
from tests.support.nodes import Gpu, GPUNodeFactory

pytestmark = [pytest.mark.integration, pytest.mark.skipif(server.binary() is None, reason=monitoring.NO_PROMETHEUS)]

RATE_INTERVAL = "5m"  # what Grafana gives $__rate_interval over a few hours at a 15 s scrape; covers the scenario


@pytest.fixture
def prometheus(admitting: OperatorProcess, metrics_token: str, tmp_path: Path) -> Iterator[server.Prometheus]:
    """A Prometheus scraping the module's operator every second with a metrics-reader token."""
    running = server.Prometheus(tmp_path / "prometheus", [admitting.port], metrics_token).start()
    yield running
    running.stop()


def highest(prometheus: server.Prometheus, expr: str) -> float:
    """The largest value an instant query returns now; -inf for none."""
    return max((float(s["value"][1]) for s in prometheus.query(expr)), default=-math.inf)


def scraped(prometheus: server.Prometheus, expr: str, at_least: float) -> None:
    """Wait until Prometheus has a sample of `expr` at `at_least` or more: a scrape after what made it so."""
    wait_for(f"Prometheus to scrape {expr} >= {at_least}", lambda: highest(prometheus, expr) >= at_least)


def bound(kube: Kube, namespace: str, name: str) -> bool:
    return kube.get(kinds.GPU_DEVICE, name, namespace).get("status", {}).get("phase") == "Bound"


def scenario(kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory, prometheus: server.Prometheus) -> None:
    """A node of 2 units, both held; a 2-unit order waiting; two VMIs admitted and bound on a scrape each; one
    refused; a budget with a limit and a total in use. Histograms need an increase between two scrapes to
    give a quantile, hence the waits for Prometheus between the VMIs."""
    gpu_node({gpu.resource: 2})
    kube.create(kinds.GPU_BUDGET, budget_body(namespace, limits={gpu.cls: 4}, total=5))
    for name in ("h1", "h2"):
        kube.create(kinds.GPU_DEVICE, gpu_device_body(name, namespace, gpu.cls))
    wait_for("h1 and h2 bound", lambda: bound(kube, namespace, "h1") and bound(kube, namespace, "h2"))
    kube.create(kinds.GPU_DEVICE, gpu_device_body("waits", namespace, gpu.cls, count=2))
    scraped(prometheus, f'cozygpu_devices{{class="{gpu.cls}", phase="Pending"}}', 1)

    kube.create(kinds.VMI, vmi_body("vm1", namespace, [{"device": "h1"}]))
    scraped(prometheus, 'sum(cozygpu_bind_duration_seconds_count{result="Succeeded"})', 1)
    kube.create(kinds.VMI, vmi_body("vm2", namespace, [{"device": "h2"}]))
    with pytest.raises(ApiError):
        kube.create(kinds.VMI, vmi_body("taken", namespace, [{"device": "h1"}]))
    scraped(prometheus, 'sum(cozygpu_bind_duration_seconds_count{result="Succeeded"})', 2)
    scraped(prometheus, 'sum(cozygpu_admission_duration_seconds_count{webhook="vmi", result="denied"})', 1)
    scraped(prometheus, f'cozygpu_budget_used_total_units{{namespace="{namespace}"}}', 4)


def no_data(result: list[dict[str, Any]]) -> bool:
    """No series, or only NaN (a quantile over no increase): a panel that would show nothing."""
    return all(math.isnan(float(s["value"][1])) for s in result)


def test_every_panel_and_variable_of_the_dashboards_returns_data_from_a_real_prometheus(
    prometheus: server.Prometheus, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """Each panel's query returns a number and each variable lists values; the chart's rules evaluate cleanly."""
    scraped(prometheus, f'up{{job="{server.JOB}"}}', 1)  # the token passed the operator's check
    scenario(kube, namespace, gpu, gpu_node, prometheus)

    empty = []
    for file, dashboard in monitoring.dashboards().items():
        queries = monitoring.panel_queries(dashboard)
        assert len(queries) > 10, file
        for panel, expr in queries:
            query = monitoring.grafana(dashboard, expr, RATE_INTERVAL)
            if no_data(prometheus.query(query)):
                empty.append(f"{file}: {panel}: {query}")
        for variable, metric, label in monitoring.variable_queries(dashboard):
            if not prometheus.api(f"label/{label}/values", **{"match[]": metric}):
                empty.append(f"{file}: variable {variable}: label_values({metric}, {label})")
    assert empty == []

    def evaluated() -> list[dict[str, Any]] | None:
        rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
        return rules if rules and all(r["health"] != "unknown" for r in rules) else None

    rules = wait_for("every rule evaluated", evaluated)
    assert {r["name"] for r in rules} == {r["alert"] for r in monitoring.rules()}
    assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []
    for name in ("vm1", "vm2"):
        kube.delete(kinds.VMI, name, namespace)
