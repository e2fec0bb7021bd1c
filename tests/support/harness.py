"""The operator in a child process, and the webhook's side of §4, for tests, demo and benchmarks; not shipped.

`OperatorProcess` runs `cozygpu run` against a dev control plane, so a caller can
stop it, kill it and start it again (restarts, §4). `write_request` writes a bind
request exactly as §4 says the VMI webhook does.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import requests

from cozygpu.api import kinds
from cozygpu.api.meta import now
from cozygpu.api.names import API_VERSION
from cozygpu.devcluster.processes import stop_gently
from cozygpu.kube.adapter import Body, Conflict, Kube
from cozygpu.ports import free_port

T = TypeVar("T")
Item = TypeVar("Item")


class OperatorProcess:
    def __init__(self, kubeconfig: Path, log_path: Path, *extra: str, env: Mapping[str, str] | None = None) -> None:
        """`extra`: more flags for `cozygpu run`; `env`: COZYGPU_* variables (a Deployment's) over this process's."""
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.extra = extra
        self.env = dict(env or {})
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0, *, until_ready: bool = True) -> OperatorProcess:
        """Start and wait until /readyz is ok (or, for a standby that will not lead yet, /healthz)."""
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        argv = [
            sys.executable,
            "-m",
            "cozygpu.cli",
            "--log-format",
            "json",
            "run",
            "--kubeconfig",
            str(self.kubeconfig),
            "--health-host",
            "127.0.0.1",
            "--health-port",
            str(self.port),
            *self.extra,
        ]
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env})
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"operator exited with {self.proc.returncode}:\n{self.tail()}")
            if self.ready() or (not until_ready and self.healthy()):
                return self
            time.sleep(0.1)
        tail = self.tail()
        self.stop()  # not left running: nothing else would stop it, and it would hold the Lease
        raise RuntimeError(f"operator not ready in {timeout}s:\n{tail}")

    def ready(self) -> bool:
        return self.probe("/readyz")[0] == 200

    def healthy(self) -> bool:
        return self.probe("/healthz")[0] == 200

    def probe(self, path: str) -> tuple[int, str]:
        """The status code and text of a health endpoint; (0, "") while nothing answers."""
        try:
            answer = requests.get(f"http://127.0.0.1:{self.port}{path}", timeout=1)
        except requests.RequestException:
            return 0, ""
        return answer.status_code, answer.text

    def metrics(self, token: str | None) -> requests.Response:
        """GET /metrics, as a scraper with this bearer token (§14.4), or as anyone when None."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return requests.get(f"http://127.0.0.1:{self.port}/metrics", headers=headers, timeout=5)

    def stop(self) -> None:
        if self.proc is not None:
            stop_gently(self.proc)
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def events(self, name: str) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and entry.get("event") == name:
                out.append(entry)
        return out


def logged(
    process: OperatorProcess, name: str, match: Callable[[dict[str, Any]], bool], timeout: float = 10.0
) -> list[dict[str, Any]]:
    """The process's log events of that name that match, once there is at least one.

    A decision is logged right after its writes land, so a caller that saw the writes waits for the line."""
    return wait_for(f"a {name} log event", lambda: [e for e in process.events(name) if match(e)], timeout)


def in_parallel(
    kubeconfig: Path, items: Sequence[Item], act: Callable[[Kube, Item], object], threads: int = 16
) -> float:
    """`act` on every item from `threads` threads, each with its own client (benchmarks filling a cluster);
    the monotonic time the last one ended."""
    work: queue.SimpleQueue[Item] = queue.SimpleQueue()
    for item in items:
        work.put(item)

    def drain(kube: Kube) -> None:
        while True:
            try:
                item = work.get_nowait()
            except queue.Empty:
                return
            act(kube, item)

    with ThreadPoolExecutor(threads) as pool:
        for future in [pool.submit(drain, Kube.from_kubeconfig(kubeconfig)) for _ in range(threads)]:
            future.result()
    return time.monotonic()


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 30.0) -> T:
    """Poll `probe` until it returns something truthy; the tests' own waiting, not the operator's."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def template_device(kube: Kube, namespace: str, name: str, class_name: str, count: int = 1) -> Body:
    """A device as the VMI webhook creates it for a deviceTemplate entry."""
    return kube.create(
        kinds.GPU_DEVICE,
        {
            "apiVersion": API_VERSION,
            "kind": "GPUDevice",
            "metadata": {"name": name, "namespace": namespace, "labels": {"gpu.cozystack.io/template-device": "true"}},
            "spec": {"className": class_name, "count": count},
        },
    )


def write_request(kube: Kube, namespace: str, names: list[str], vmi: str) -> str:
    """§4 as the webhook does it: attachedTo and a fresh bindRequest on each device, under its resourceVersion."""
    request_id = str(uuid.uuid4())
    at = now().isoformat().replace("+00:00", "Z")
    for name in names:
        for _ in range(10):
            body = kube.get(kinds.GPU_DEVICE, name, namespace)
            status = body.setdefault("status", {})
            status.setdefault("attachedTo", {"vmi": vmi, "since": at})
            status["bindRequest"] = {"id": request_id, "vmi": vmi, "devices": names, "requestedAt": at}
            try:
                kube.replace_status(kinds.GPU_DEVICE, body)
                break
            except Conflict:
                continue
        else:
            raise AssertionError(f"could not write the request on {name}")
    return request_id


def answer_of(kube: Kube, namespace: str, names: list[str], request_id: str, timeout: float = 30.0) -> list[Body]:
    """Wait until every device carries a result for the request; return the devices."""

    def probe() -> list[Body] | None:
        bodies = [kube.get(kinds.GPU_DEVICE, n, namespace) for n in names]
        for b in bodies:
            r = b.get("status", {}).get("bindRequest") or {}
            if r.get("id") != request_id or not r.get("result"):
                return None
        return bodies

    return wait_for(f"the answer to {request_id}", probe, timeout)
