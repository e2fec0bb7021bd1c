"""`cozygpu dev-cluster` runs the control plane in the foreground and cleans up on SIGTERM/Ctrl-C."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cozygpu.api import kinds
from cozygpu.kube.adapter import Kube

pytestmark = pytest.mark.integration


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            pids.append(int(entry.name))
    return pids


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_dev_cluster_serves_then_stops_cleanly(tmp_path: Path, stop_signal: signal.Signals) -> None:
    """It prints one ready line, serves our kinds at the written kubeconfig, and leaves nothing behind."""
    kubeconfig = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cozygpu.cli", "dev-cluster", "--kubeconfig", str(kubeconfig)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("dev-cluster ready:"), line + (proc.stderr.read() if proc.stderr else "")
        match = re.search(r"data=(\S+)", line)
        assert match
        data = match.group(1)
        assert Path(data).is_dir()
        assert _processes_mentioning(data), "etcd and kube-apiserver should run with their data there"

        kube = Kube.from_kubeconfig(kubeconfig)
        assert kube.list(kinds.GPU_DEVICE) == []
        assert kube.list(kinds.VMI) == []

        proc.send_signal(stop_signal)
        assert proc.wait(timeout=60) == 0
        deadline = time.monotonic() + 10
        while _processes_mentioning(data) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _processes_mentioning(data) == []
        assert not Path(data).exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_dev_cluster_killed_outright_takes_its_processes_along(tmp_path: Path) -> None:
    """SIGKILL leaves no chance to clean up, yet etcd and kube-apiserver end with their parent."""
    kubeconfig = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cozygpu.cli", "dev-cluster", "--kubeconfig", str(kubeconfig)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"data=(\S+)", line)
    assert match, line
    data = match.group(1)
    assert _processes_mentioning(data)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 20
    while _processes_mentioning(data) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_mentioning(data) == []
    shutil.rmtree(data, ignore_errors=True)
