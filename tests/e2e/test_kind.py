"""End to end on kind with KubeVirt (§11): for machines with a Docker engine and network access.

Here the tests skip with the reason; the same checks run against the real API server
in tests/integration on every machine.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cozygpu.api import KINDS, crdgen, kinds
from cozygpu.kube.adapter import Kube

pytestmark = pytest.mark.e2e


def _docker_engine() -> str | None:
    """Why kind cannot run here, or None when it can."""
    if shutil.which("docker") is None:
        return "no docker client on this machine"
    probe = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return "no Docker engine is running (docker info failed), so kind cannot start a cluster"
    return None


@pytest.fixture(scope="module")
def kind_kube(request: pytest.FixtureRequest) -> Any:
    reason = _docker_engine()
    if reason:
        pytest.skip(f"kind end-to-end tests need Docker: {reason}")
    kind_cluster = request.getfixturevalue("kind_cluster")
    return Kube.from_kubeconfig(Path(kind_cluster.kubeconfig_path))


def test_crds_install_on_kind(kind_kube: Kube) -> None:
    """Our generated CRDs are accepted and established by a kind cluster's API server."""
    for kind in KINDS:
        kind_kube.create(kinds.CRD, crdgen.crd(kind))
    names = {c["metadata"]["name"] for c in kind_kube.list(kinds.CRD)}
    assert {f"{k.crd.plural}.gpu.cozystack.io" for k in KINDS} <= names
