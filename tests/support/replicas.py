"""Replicas behind one address, as a Service spreads the API server's webhook calls over a Deployment (§10).

`Balancer`: a round-robin TCP pass-through on the loopback (TLS is end to end, so the API server's client
certificate reaches each replica); a connection whose backend refuses it goes to the next one, as a Service
with readiness stops sending traffic to a replica that is gone. `Replicas`: `cozygpu run` processes in
cluster mode (listening on the loopback: COZYGPU_WEBHOOK_HOST, which the fixture sets, as the CLI has no
flag for it), each with its own identity, health and webhook ports, serving one certificate of the test's
own CA and competing for a Lease of the test's own. The test registers the configurations itself, at the
balancer, as the chart does at its Service (`Replicas.register`).
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path

from cozygpu import tls
from cozygpu.api import kinds
from cozygpu.api.names import gpu_entry_name
from cozygpu.devcluster import identity
from cozygpu.kube.adapter import ApiError, Kube
from cozygpu.ports import free_port
from cozygpu.runtime.admission import policy, webhooks
from cozygpu.settings import Settings
from tests.support.bodies import unique, vmi_body
from tests.support.harness import OperatorProcess, wait_for
from tests.support.operators import start_operator, unregister_webhooks

HOST = "127.0.0.1"


class Balancer:
    """Round robin over `backends` (ports on the loopback), changed at any time; plain TCP, both ways."""

    def __init__(self) -> None:
        self.backends: list[int] = []
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._server = socket.create_server((HOST, 0))
        self.port: int = self._server.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="balancer").start()

    def add(self, port: int) -> None:
        with self._lock:
            self.backends.append(port)

    def remove(self, port: int) -> None:
        with self._lock:
            self.backends.remove(port)

    def close(self) -> None:
        self._closed = True
        self._server.close()
        with self._lock:
            for s in list(self._open):
                with contextlib.suppress(OSError):
                    s.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _connect(self) -> socket.socket | None:
        """The next backend that takes the connection, trying each once."""
        with self._lock:
            ports = list(self.backends)
            first = next(self._turn)
        for i in range(len(ports)):
            try:
                return socket.create_connection((HOST, ports[(first + i) % len(ports)]), timeout=2)
            except OSError:
                continue
        return None

    def _serve(self, client: socket.socket) -> None:
        backend = self._connect()
        if backend is None:
            client.close()
            return
        backend.settimeout(None)
        with self._lock:
            self._open |= {client, backend}
        pump = threading.Thread(target=_pipe, args=(backend, client), daemon=True)
        pump.start()
        _pipe(client, backend)
        pump.join()
        with self._lock:
            self._open -= {client, backend}
        client.close()
        backend.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    """Copy until either side ends; then end the other one's writing, so a close travels through."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    for s in (sink, source):
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)


@dataclass
class Replica:
    identity: str
    webhook_port: int
    process: OperatorProcess


@dataclass
class Replicas:
    """Operator replicas in cluster mode behind a Balancer; `start` one more, `stop` or `kill` one."""

    kubeconfig: Path
    directory: Path
    lease: str
    client_ca: bytes
    extra: tuple[str, ...] = ()
    balancer: Balancer = field(default_factory=Balancer)
    live: list[Replica] = field(default_factory=list)
    gone: list[Replica] = field(default_factory=list)
    _numbers: itertools.count[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        ca = tls.Authority("replicas' webhook CA (test)")
        leaf = ca.serving([HOST, "localhost"])
        self.ca_pem = ca.cert_pem
        self.cert_dir = self.directory / "tls"
        self.cert_dir.mkdir()
        (self.cert_dir / "tls.crt").write_bytes(leaf.cert_pem)
        (self.cert_dir / "tls.key").write_bytes(leaf.key_pem)
        (self.directory / "client-ca.crt").write_bytes(self.client_ca)

    def start(self) -> Replica:
        """One more replica, ready (leader or standby), in the balancer's turn."""
        name = f"replica-{next(self._numbers)}"
        port = free_port()
        (self.directory / name).mkdir()
        process = start_operator(
            self.kubeconfig,
            self.directory / name,
            "--identity",
            name,
            "--lease-name",
            self.lease,
            "--lease-duration",
            "6",
            "--webhook-port",
            str(port),
            "--webhook-cert-dir",
            str(self.cert_dir),
            "--webhook-client-ca",
            str(self.directory / "client-ca.crt"),
            *self.extra,
        )
        replica = Replica(name, port, process)
        self.live.append(replica)
        self.balancer.add(port)
        return replica

    def _out(self, replica: Replica) -> None:
        self.live.remove(replica)
        self.gone.append(replica)
        self.balancer.remove(replica.webhook_port)

    def stop(self, replica: Replica) -> None:
        """SIGTERM, as a rolling upgrade does: out of the balancer's turn first, as out of the Service's endpoints."""
        self._out(replica)
        replica.process.stop()

    def kill(self, replica: Replica) -> None:
        """SIGKILL; the balancer still sends it connections, and they go to the next replica when refused."""
        self.live.remove(replica)
        self.gone.append(replica)
        replica.process.kill()

    def leader(self, kube: Kube) -> Replica:
        """The replica holding the Lease, once one does and says it decides."""

        def holder() -> Replica | None:
            lease = kube.get_or_none(kinds.kind("Lease"), self.lease, identity.NAMESPACE) or {}
            who = (lease.get("spec") or {}).get("holderIdentity")
            return next((r for r in self.live if r.identity == who and r.process.events("operator.deciding")), None)

        return wait_for(f"a leader of {self.lease}", holder, timeout=30)

    def register(self, kube: Kube, timeout: float = 20) -> None:
        """The configurations of §3 at the balancer, and the no-bypass policies (§12.3), as the chart installs them:
        a class is Ready only once the policy is seen guarding its resource. The policies stay after `close`, as a
        chart's do until it is uninstalled (deleting a binding would leave the API server blind to its parameter)."""
        for config in webhooks.configurations(
            f"https://{HOST}:{self.balancer.port}", self.ca_pem, timeout, identity.USERNAME
        ):
            kind = kinds.MUTATING_WEBHOOKS if config["kind"].startswith("Mutating") else kinds.VALIDATING_WEBHOOKS
            kube.create(kind, config)
        controller = Settings().kubevirt_controller_user
        for made in (
            policy.policy(controller),
            policy.binding(identity.NAMESPACE),
            policy.webhooks_policy(),
            policy.webhooks_binding(),
        ):
            kube.put_object(kinds.POLICY if made["kind"] == "ValidatingAdmissionPolicy" else kinds.POLICY_BINDING, made)

    def serving(self, kube: Kube, namespace: str, class_name: str) -> None:
        """Register at the balancer and wait until the API server calls it: a dry-run VMI comes back with its GPU."""
        self.register(kube)
        refs = [{"deviceTemplate": {"className": class_name, "count": 1}}]

        def called() -> bool:
            try:
                body = kube.create(kinds.VMI, vmi_body(unique("probe"), namespace, refs), dry_run=True)
            except ApiError:
                return False
            gpus = (body.get("spec") or {}).get("domain", {}).get("devices", {}).get("gpus") or []
            return [g["name"] for g in gpus] == [gpu_entry_name(0, 0)]

        wait_for("the API server to call the replicas", called, timeout=20)

    def close(self, kube: Kube) -> None:
        for replica in list(self.live):
            replica.process.stop()
        unregister_webhooks(kube)
        self.balancer.close()
