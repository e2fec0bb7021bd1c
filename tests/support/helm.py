"""helm as the chart's tests run it: the binary the hack script builds from the Go module proxy, with config,
cache and data directories of its own (nothing read from or left in the user's), and the chart's documents."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from cozygpu.devcluster import binaries, identity

CHART = binaries.repo_root() / "charts" / "cozy-gpu-operator"
RELEASE, NAMESPACE = identity.NAME, identity.NAMESPACE  # the chart's defaults are the dev identity's names
# The chart renders only once something admits the API server to the webhook port (§14.1): an address from
# TEST-NET-1 (RFC 5737) unless a test says otherwise.
API_SERVER = ("--set", "networkPolicy.apiServer.cidrs={192.0.2.10/32}")


class Helm:
    def __init__(self, home: Path, kubeconfig: Path | None = None) -> None:
        self.binary = binaries.find(("helm",)) / "helm"
        self.env = {**os.environ, **{f"HELM_{d}_HOME": str(home / d.lower()) for d in ("CACHE", "CONFIG", "DATA")}}
        if kubeconfig is not None:
            self.env["KUBECONFIG"] = str(kubeconfig)

    def attempt(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.binary), *args], capture_output=True, text=True, check=False, env=self.env)

    def run(self, *args: str) -> str:
        done = self.attempt(*args)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def refused(self, *args: str) -> str:
        """What helm says when it refuses the command (lint reports on stdout, the rest on stderr)."""
        done = self.attempt(*args)
        assert done.returncode != 0, done.stdout
        return done.stdout + done.stderr

    def render(
        self,
        *args: str,
        chart: Path = CHART,
        release: str = RELEASE,
        namespace: str = NAMESPACE,
        fence: tuple[str, ...] = API_SERVER,
    ) -> list[dict[str, Any]]:
        out = self.run("template", release, str(chart), "--namespace", namespace, *fence, *args)
        return [d for d in yaml.safe_load_all(out) if d]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    [found] = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return found
