"""Process supervision for the dev tools: start a named process with its log in a directory, wait until it is
ready (or say why not, from the end of its log), and stop what was started, last first.

Used by the control plane (devcluster.controlplane: etcd, kube-apiserver, kube-controller-manager), KubeVirt in
the loop (devcluster.kubevirt: kube-scheduler, virt-api, virt-controller) and the test harness's operators and
Prometheus (`stop_gently`). What they share is this, not each other.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import requests


class ProcessError(RuntimeError):
    """A supervised process exited or did not become ready; the message ends with its log's end."""


def _die_with_parent() -> None:
    # Linux PR_SET_PDEATHSIG: the dev processes get SIGKILL if the launcher is killed outright (their data is
    # thrown away anyway), so nothing outlives a killed run.
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def stop_gently(proc: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    """SIGTERM, then SIGKILL if the process has not ended within `grace` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Processes:
    """The processes started here, each logging to `<directory>/<name>.log`."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._running: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = []

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self._directory / f"{name}.log", "wb")  # noqa: SIM115 - closed when it is stopped
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - prctl only, no locks taken
        )
        self._running.append((name, proc, log))
        return proc

    def failed(self, name: str, why: str) -> ProcessError:
        log = (self._directory / f"{name}.log").read_text(errors="replace")[-3000:]
        return ProcessError(f"{name} {why}; the end of its log:\n{log}")

    def wait_until(
        self, name: str, proc: subprocess.Popen[bytes], ready: Callable[[], object], deadline: float
    ) -> None:
        """Until `ready()` is true (its connection errors count as not yet), or fail if the process exits."""
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise self.failed(name, f"exited with {proc.returncode}")
            try:
                if ready():
                    return
            except (requests.RequestException, OSError):
                pass
            time.sleep(0.2)
        raise self.failed(name, "did not become ready in time")

    def named(self, name: str) -> subprocess.Popen[bytes]:
        """The running process of that name."""
        return next(proc for n, proc, _ in self._running if n == name)

    def kill(self, name: str) -> None:
        """Kill the process of that name as a crash would, and forget it (`spawn` may start it again)."""
        for i, (n, proc, log) in enumerate(self._running):
            if n == name:
                proc.kill()
                proc.wait()
                log.close()
                del self._running[i]
                return

    def stop_all(self) -> None:
        """Terminate every process, last started first (SIGKILL after 15 s), and close their logs."""
        for _name, proc, log in reversed(self._running):
            stop_gently(proc, grace=15)
            log.close()
        self._running.clear()
