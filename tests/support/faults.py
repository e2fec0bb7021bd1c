"""Faults the reliability and integration tiers inject into the dev control plane: an API server crash and
restart, an API server that stops answering, an etcd compaction. Test tooling, not shipped with the operator."""

from __future__ import annotations

import base64
import signal
import time

import requests

from cozygpu.api import kinds
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import ApiError, Kube


def restart_apiserver(plane: ControlPlane, down: float = 0.0, timeout: float = 60.0) -> None:
    """Kill kube-apiserver as a crash would, keep it down `down` seconds, and start it again on the same address and
    certificates (what the operator sees of an API server restart); back once /readyz is."""
    plane.processes.kill("kube-apiserver")
    time.sleep(down)
    proc = plane.processes.spawn("kube-apiserver", plane.apiserver_argv)
    kube = plane.kube()
    deadline = time.monotonic() + timeout
    plane.processes.wait_until("kube-apiserver", proc, lambda: kube.raw_get("/readyz").ok, deadline)
    # /readyz comes before a custom resource's storage is initialized again ("storage is (re)initializing"): the
    # next test would meet it.
    plane.processes.wait_until("kube-apiserver", proc, lambda: _serves_ours(kube), deadline)


def _serves_ours(kube: Kube) -> bool:
    try:
        kube.list(kinds.GPU_CLASS)
    except ApiError:
        return False
    return True


def freeze_apiserver(plane: ControlPlane, seconds: float) -> None:
    """Stop kube-apiserver (SIGSTOP) for `seconds`, then let it go on: connections stay open, nothing answers."""
    proc = plane.processes.named("kube-apiserver")
    proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        proc.send_signal(signal.SIGCONT)


def compact_etcd(plane: ControlPlane) -> int:
    """Compact etcd up to its current revision (v3 HTTP gateway), as the API server does every five minutes: a watch
    that resumes from an older version is answered 410 Gone. Returns the revision."""
    key = base64.b64encode(b"/").decode()
    head = requests.post(f"{plane.etcd_url}/v3/kv/range", json={"key": key, "limit": 1}, timeout=10)
    head.raise_for_status()
    revision = int(head.json()["header"]["revision"])
    done = requests.post(
        f"{plane.etcd_url}/v3/kv/compaction", json={"revision": revision, "physical": True}, timeout=30
    )
    done.raise_for_status()
    return revision
