"""The chart's monitoring objects (issue 23 items 4 and 5), rendered by a real helm.

Rendered only where the Prometheus Operator's API is served or a value says so; the PrometheusRule is the rule
file promtool tests, with the values applied; the ServiceMonitor finds the Service, names the job the rules read
and sends a token; the scraper identity it renders is accepted by the API server and its token passes the
operator's /metrics check (the token Secret itself is filled by kube-controller-manager's token controller, which
the test control plane does not run: the test asks for a token of the same ServiceAccount instead).
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cozygpu.api import kinds
from cozygpu.devcluster import binaries, identity
from cozygpu.devcluster import prometheus as server
from cozygpu.kube.adapter import Kube
from tests.support import monitoring
from tests.support.harness import OperatorProcess, wait_for

pytestmark = pytest.mark.integration

FENCE = ("--set", "networkPolicy.apiServer.cidrs={192.0.2.10/32}")  # the chart renders only with one (§14.1)
SERVED = ("--api-versions", "monitoring.coreos.com/v1")
MONITORING_KINDS = {"ServiceMonitor", "PrometheusRule", "ConfigMap"}


@pytest.fixture(scope="module")
def helm() -> Path:
    return binaries.find(("helm",)) / "helm"


def render(helm: Path, *args: str, release: str = "gpu", namespace: str = "gpu-system") -> list[dict[str, Any]]:
    done = subprocess.run(
        [str(helm), "template", release, str(monitoring.CHART), "--namespace", namespace, *FENCE, *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def monitoring_kinds(docs: list[dict[str, Any]]) -> set[str]:
    return {d["kind"] for d in docs if d["kind"] in {"ServiceMonitor", "PrometheusRule"}} | {
        "ConfigMap" for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboards")
    }


def test_monitoring_renders_where_the_prometheus_operator_is_served_or_a_value_says_so(helm: Path) -> None:
    """auto: with monitoring.coreos.com/v1 only; true renders without it, false leaves it out with it."""
    assert monitoring_kinds(render(helm)) == set()
    assert monitoring_kinds(render(helm, *SERVED)) == MONITORING_KINDS
    forced = [f"monitoring.{k}.enabled=true" for k in ("serviceMonitor", "prometheusRule", "dashboards")]
    assert monitoring_kinds(render(helm, "--set", ",".join(forced))) == MONITORING_KINDS
    off = [f"monitoring.{k}.enabled=false" for k in ("serviceMonitor", "prometheusRule", "dashboards")]
    assert monitoring_kinds(render(helm, *SERVED, "--set", ",".join(off))) == set()


def test_the_prometheus_rule_is_the_rule_file_with_the_values_applied(helm: Path, tmp_path: Path) -> None:
    """Disabled alerts out, ruleLabels on each, runbook_url at its base, the rest the file's; promtool loads it."""
    docs = render(
        helm,
        *SERVED,
        "--set",
        "monitoring.prometheusRule.ruleLabels.team=gpu,"
        "monitoring.prometheusRule.disabled={CozyGPUOverBudget},"
        "monitoring.prometheusRule.runbookBaseURL=https://wiki.example/gpu",
        "--set",
        "monitoring.prometheusRule.labels.role=alert-rules",
    )
    [rule] = of_kind(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["role"] == "alert-rules"
    rendered = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    source = {r["alert"]: r for r in monitoring.rules()}
    assert set(rendered) == set(source) - {"CozyGPUOverBudget"}
    for name, r in rendered.items():
        assert (r["expr"], r["for"]) == (source[name]["expr"], source[name]["for"])
        assert r["labels"] == {**source[name]["labels"], "team": "gpu"}
        assert r["annotations"] == {
            **source[name]["annotations"],
            "runbook_url": f"https://wiki.example/gpu#{name.lower()}",
        }
    [default] = of_kind(render(helm, *SERVED), "PrometheusRule")
    assert [r for g in default["spec"]["groups"] for r in g["rules"]] == monitoring.rules()
    promtool = monitoring.promtool()
    if promtool is not None:
        (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
        done = subprocess.run(
            [promtool, "check", "rules", str(tmp_path / "rules.yaml")], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_service_monitor_scrapes_the_service_as_the_job_the_rules_read(helm: Path) -> None:
    """The Service's http port, the job the rules' `up` reads whatever the release, the operator's labels honoured."""
    docs = render(helm, *SERVED, "--set", "monitoring.serviceMonitor.labels.release=prom", release="other-name")
    [monitor] = of_kind(docs, "ServiceMonitor")
    [service] = of_kind(docs, "Service")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["gpu-system"]}
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == server.JOB
    [endpoint] = monitor["spec"]["endpoints"]
    assert "http" in {p["name"] for p in service["spec"]["ports"]}
    assert (endpoint["port"], endpoint["path"], endpoint["honorLabels"]) == ("http", "/metrics", True)


def test_the_scrape_sends_a_token_bound_to_the_metrics_reader(helm: Path) -> None:
    """secret: the chart's bound scraper's token; serviceAccount: Prometheus's own, subjects bound; no auth: none."""
    docs = render(helm, *SERVED)
    [monitor] = of_kind(docs, "ServiceMonitor")
    [secret] = [s for s in of_kind(docs, "Secret") if s["type"] == "kubernetes.io/service-account-token"]
    [binding] = [b for b in of_kind(docs, "ClusterRoleBinding") if b["roleRef"]["name"] == "gpu-metrics-reader"]
    assert monitor["spec"]["endpoints"][0]["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": secret["metadata"]["name"], "key": "token"},
    }
    account = secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]
    assert account in {a["metadata"]["name"] for a in of_kind(docs, "ServiceAccount")}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "gpu-system"}]

    prometheus = {"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}
    subjects = f"monitoring.serviceMonitor.readerSubjects={json.dumps([prometheus])}"
    docs = render(helm, *SERVED, "--set", "monitoring.serviceMonitor.auth=serviceAccount", "--set-json", subjects)
    [monitor] = of_kind(docs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    [binding] = [b for b in of_kind(docs, "ClusterRoleBinding") if b["roleRef"]["name"] == "gpu-metrics-reader"]
    assert binding["subjects"] == [prometheus]
    assert not [s for s in of_kind(docs, "Secret") if s["type"] == "kubernetes.io/service-account-token"]

    docs = render(helm, *SERVED, "--set", "operator.metricsAuth=false")
    [endpoint] = of_kind(docs, "ServiceMonitor")[0]["spec"]["endpoints"]
    assert not {"authorization", "bearerTokenFile"} & set(endpoint)
    assert not [b for b in of_kind(docs, "ClusterRoleBinding") if b["roleRef"]["name"] == "gpu-metrics-reader"]


def test_the_dashboards_ship_in_a_config_map_labelled_for_grafanas_sidecar(helm: Path) -> None:
    """Every files/dashboards/*.json under its file name, the sidecar's label, the namespace and annotations given."""
    docs = render(
        helm,
        *SERVED,
        "--set",
        "monitoring.dashboards.namespace=grafana,"
        "monitoring.dashboards.label=find_me,monitoring.dashboards.labelValue=yes,"
        "monitoring.dashboards.annotations.grafana_folder=GPUs",
    )
    [config] = [c for c in of_kind(docs, "ConfigMap") if c["metadata"]["name"] == "gpu-dashboards"]
    assert config["metadata"]["namespace"] == "grafana"
    assert config["metadata"]["labels"]["find_me"] == "yes"
    assert config["metadata"]["annotations"] == {"grafana_folder": "GPUs"}
    assert {name: yaml.safe_load(text) for name, text in config["data"].items()} == monitoring.dashboards()
    [default] = [c for c in of_kind(render(helm, *SERVED), "ConfigMap") if c["metadata"]["name"] == "gpu-dashboards"]
    assert default["metadata"]["labels"]["grafana_dashboard"] == "1"


@pytest.fixture
def scraper_namespace(kube: Kube) -> Iterator[str]:
    name = f"scrape-{uuid.uuid4().hex[:6]}"
    kube.create(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    kube.delete(kinds.NAMESPACE, name)


def test_the_rendered_scraper_is_accepted_and_its_token_reads_the_operators_metrics(
    helm: Path, kube: Kube, operator: OperatorProcess, metrics_token: str, scraper_namespace: str
) -> None:
    """The scraper's account, token Secret and binding are created; its token reads /metrics, and not once unbound."""
    # The release is named as the dev identity, whose metrics-reader ClusterRole `metrics_token` installs.
    docs = render(helm, *SERVED, release=identity.NAME, namespace=scraper_namespace)
    account = next(a for a in of_kind(docs, "ServiceAccount") if a["metadata"]["name"].endswith("-metrics-scraper"))
    [secret] = [s for s in of_kind(docs, "Secret") if s["type"] == "kubernetes.io/service-account-token"]
    [binding] = [b for b in of_kind(docs, "ClusterRoleBinding") if b["roleRef"]["name"] == identity.METRICS_READER]
    for doc in (account, secret, binding):
        kube.create(kinds.kind(doc["kind"]), doc)
    try:
        token = kube.request_token(scraper_namespace, account["metadata"]["name"], seconds=600)
        assert operator.metrics(token).status_code == 200
    finally:
        kube.delete(kinds.kind("ClusterRoleBinding"), binding["metadata"]["name"])

    def refused() -> bool:  # a fresh token each time: the operator keeps an answer per token for a minute
        token = kube.request_token(scraper_namespace, account["metadata"]["name"], seconds=600)
        return operator.metrics(token).status_code == 403

    wait_for("the unbound scraper refused", refused)
