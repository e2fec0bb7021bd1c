"""A real Prometheus scraping operator processes, for the dashboard's test and `make demo` (issue 23 item 5).

The binary is Debian's `prometheus` package's (`.ci/run` installs it); `binary()` is None where it is not
installed, and callers skip or say so. The scrape is configured as the chart's ServiceMonitor configures the
Prometheus Operator's: job `cozy-gpu-operator`, the operator's labels honoured, and a bearer token (a scraper's
bound to the metrics-reader ClusterRole, §14.4) read from a file, or none for `--no-metrics-auth`. The chart's
alert rules (files/prometheus-rules.yaml) are loaded, so a caller can see them evaluate against real series.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import requests
import yaml

from cozygpu.devcluster.binaries import repo_root
from cozygpu.devcluster.processes import stop_gently
from cozygpu.ports import free_port

JOB = "cozy-gpu-operator"  # the job the chart's ServiceMonitor names (jobLabel) and its rules read `up` by
RULES = repo_root() / "charts" / "cozy-gpu-operator" / "files" / "prometheus-rules.yaml"


def binary() -> str | None:
    """The prometheus server's path, or None where it is not installed."""
    return shutil.which("prometheus")


class Prometheus:
    def __init__(self, directory: Path, targets: list[int], token: str | None, interval: str = "1s") -> None:
        """Scrape the operators' health ports on loopback every `interval`, sending `token` if given."""
        self.directory = directory
        self.targets = targets
        self.token = token
        self.interval = interval
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        scrape: dict[str, Any] = {
            "job_name": JOB,
            "honor_labels": True,
            "metrics_path": "/metrics",
            "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in self.targets]}],
        }
        if self.token is not None:
            token_file = self.directory / "token"
            token_file.write_text(self.token)
            token_file.chmod(0o600)
            scrape["authorization"] = {"type": "Bearer", "credentials_file": str(token_file)}
        return {
            "global": {"scrape_interval": self.interval, "evaluation_interval": self.interval},
            "rule_files": [str(RULES)],
            "scrape_configs": [scrape],
        }

    def start(self, timeout: float = 60.0) -> Prometheus:
        """Start the server and wait until it says it is ready."""
        found = binary()
        if found is None:
            raise RuntimeError("prometheus is not installed (Debian's prometheus package)")
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "prometheus.yml"
        config.write_text(yaml.safe_dump(self.config()))
        log = open(self.directory / "prometheus.log", "ab")  # noqa: SIM115 - handed to the child
        argv = [
            found,
            f"--config.file={config}",
            f"--storage.tsdb.path={self.directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=1d",
        ]
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if requests.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"prometheus not ready in {timeout}s:\n{self.tail()}")

    def api(self, path: str, **params: Any) -> Any:
        """The `data` of a GET on the HTTP API (`/api/v1/<path>`); raises on an error answer."""
        answer = requests.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        body = answer.json()
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result: [{"metric": labels, "value": [time, "value"]}, ...]."""
        data = self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result

    def stop(self) -> None:
        if self.proc is not None:
            stop_gently(self.proc)
        self.proc = None

    def tail(self, lines: int = 30) -> str:
        path = self.directory / "prometheus.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""
