"""Finds the control plane binaries: KUBEBUILDER_ASSETS, else the hack script's cache.

The hack scripts build what is missing (Kubernetes from the Go module proxy, KubeVirt
from its source) and print the directory; callers get a clear error when that is not
possible.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REQUIRED = ("etcd", "kube-apiserver")


class BinariesUnavailable(RuntimeError):
    pass


class KubeVirtUnavailable(BinariesUnavailable):
    """No KubeVirt source or binaries here: KubeVirt's tests skip, saying this."""


KUBEVIRT_BINARIES = ("virt-controller", "virt-api", "kv-dump")
# hack/build-kubevirt.sh exits with this when no KubeVirt source can be had (not a build failure).
NO_KUBEVIRT_SOURCE = 3


def repo_root() -> Path:
    """The checkout this package runs from (it is installed editable from the repo)."""
    return Path(__file__).resolve().parents[3]


def _has(directory: Path, names: tuple[str, ...]) -> bool:
    return all(os.access(directory / n, os.X_OK) for n in names)


def find(extra: tuple[str, ...] = ()) -> Path:
    """The directory holding etcd, kube-apiserver and `extra`, building them if need be."""
    names = REQUIRED + extra
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets and _has(Path(assets), names):
        return Path(assets)
    script = repo_root() / "hack" / "build-control-plane.sh"
    if not script.exists():
        raise BinariesUnavailable(
            f"no {', '.join(names)} in KUBEBUILDER_ASSETS={assets!r} and no build script at {script}"
        )
    done = subprocess.run(["bash", str(script), *extra], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BinariesUnavailable(f"{script} failed:\n{done.stderr[-4000:]}")
    directory = Path(done.stdout.strip().splitlines()[-1])
    if not _has(directory, names):
        raise BinariesUnavailable(f"{script} printed {directory}, which lacks {', '.join(names)}")
    return directory


def find_kubevirt() -> Path:
    """The directory holding KubeVirt's virt-controller, virt-api and kv-dump (§11.1), building them if need be.

    KUBEVIRT_ASSETS, else hack/build-kubevirt.sh's cache, else a build from KubeVirt's source."""
    assets = os.environ.get("KUBEVIRT_ASSETS")
    if assets and _has(Path(assets), KUBEVIRT_BINARIES):
        return Path(assets)
    script = repo_root() / "hack" / "build-kubevirt.sh"
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
    if done.returncode == NO_KUBEVIRT_SOURCE:
        raise KubeVirtUnavailable(f"KubeVirt is not available: {done.stderr.strip().splitlines()[-1]}")
    if done.returncode != 0:
        raise BinariesUnavailable(f"{script} failed:\n{done.stderr[-4000:]}")
    directory = Path(done.stdout.strip().splitlines()[-1])
    if not _has(directory, KUBEVIRT_BINARIES):
        raise BinariesUnavailable(f"{script} printed {directory}, which lacks {', '.join(KUBEVIRT_BINARIES)}")
    return directory
