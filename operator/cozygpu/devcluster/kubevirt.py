"""KubeVirt in the loop (§11.1): kube-scheduler, virt-api, virt-controller and a fake kubelet.

Started by `ControlPlane(kubevirt=True)` after the API server is up, so tenants'
scenarios run through `VirtualMachine` objects as in a cluster: virt-controller makes
the VMI (through virt-api's webhooks and ours) and renders the launcher pod, which
kube-scheduler binds. KubeVirt's pieces run as KubeVirt's own ServiceAccounts under
KubeVirt's own RBAC (both printed by kv-dump from KubeVirt's source); the KubeVirt CR
gets the status virt-operator would write. Binaries come from hack/build-kubevirt.sh.
"""

from __future__ import annotations

import contextlib
import re
import ssl
import subprocess
import urllib.request
from pathlib import Path
from typing import Any, Protocol

import structlog
import yaml

from cozygpu import tls
from cozygpu.api import kinds
from cozygpu.api.names import KUBEVIRT_API_VERSION
from cozygpu.devcluster.kubelet import FakeKubelet
from cozygpu.devcluster.processes import Processes
from cozygpu.kube.adapter import AlreadyExists, Body, Kube
from cozygpu.ports import accepts, free_port


class Plane(Protocol):
    """What KubeVirt in the loop needs of the control plane it joins (devcluster.controlplane.ControlPlane)."""

    processes: Processes
    workdir: Path
    kubeconfig_path: Path
    ca: tls.Authority  # virt-api's serving certificate is this CA's
    virt_api_port: int

    def kube(self) -> Kube: ...

    def write_token_kubeconfig(self, path: Path, user: str, token: str, namespace: str = ...) -> Path: ...


log = structlog.get_logger("cozygpu.devcluster")

NAMESPACE = "kubevirt"
CONTROLLER_SA = "kubevirt-controller"
# virt-controller's own series: its VM workers' busy time, and its VMI creates and patches (count, seconds).
VM_WORK = 'kubevirt_workqueue_work_duration_seconds_sum{name="virt-controller-vm"}'
VMI_CALLS = re.compile(
    r'^kubevirt_rest_client_request_latency_seconds_(sum|count)\{url="[^"]*/virtualmachineinstances(/%7Bname%7D)?",'
    r'verb="(CREATE|PATCH)"\} (\S+)$'
)
API_SA = "kubevirt-apiserver"
HANDLER_SA = "kubevirt-handler"
CONTROLLER_USER = f"system:serviceaccount:{NAMESPACE}:{CONTROLLER_SA}"
HANDLER_USER = f"system:serviceaccount:{NAMESPACE}:{HANDLER_SA}"
LAUNCHER_IMAGE = "quay.io/kubevirt/virt-launcher:cozy-dev"

# The fake virt-handler writes VMI status as virt-handler's ServiceAccount (impersonated, with its
# node); kv-dump prints no RBAC for virt-handler, so it gets this.
HANDLER_RULES = [
    {
        "apiGroups": ["kubevirt.io"],
        "resources": ["virtualmachineinstances"],
        "verbs": ["get", "list", "watch", "update", "patch"],
    }
]


def kubevirt_cr(permitted: dict[str, Any] | None = None) -> Body:
    """The KubeVirt CR; `permitted` is spec.configuration.permittedHostDevices (unset: any device)."""
    configuration: dict[str, Any] = {"developerConfiguration": {"featureGates": []}}
    if permitted is not None:
        configuration["permittedHostDevices"] = permitted
    return {
        "apiVersion": KUBEVIRT_API_VERSION,
        "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": NAMESPACE},
        "spec": {"configuration": configuration},
    }


def _dump(tool: Path, *args: str) -> list[Body]:
    done = subprocess.run([str(tool), *args], capture_output=True, text=True, check=True)
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def _apply(kube: Kube, body: Body) -> None:
    kube.put_object(kinds.kind(body["kind"]), body)


class KubeVirt:
    """KubeVirt's control plane against `plane`; `start` returns once VMs can start."""

    def __init__(self, plane: Plane, scheduler_dir: Path, kubevirt_dir: Path) -> None:
        self._plane = plane
        self._scheduler_dir = scheduler_dir
        self._dir = kubevirt_dir
        self.kubelet: FakeKubelet | None = None
        self.controller_kubeconfig = plane.workdir / "kubevirt-controller.kubeconfig"
        # virt-controller's /metrics and the CA it serves under, once it runs
        self._controller_metrics: tuple[str, Path] | None = None

    def start(self, deadline: float) -> None:
        kube = self._plane.kube()
        with contextlib.suppress(AlreadyExists):
            kube.create(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for body in _dump(self._dir / "kv-dump", "-what=rbac", f"-namespace={NAMESPACE}"):
            _apply(kube, body)
        self._handler_identity(kube)
        self._kubevirt_cr(kube)
        self._start_scheduler()
        self._start_virt_api(kube, deadline)
        self._start_virt_controller(kube, deadline)
        self.kubelet = FakeKubelet(self._plane.kube(), HANDLER_USER)
        self.kubelet.start()
        log.info("devcluster.started", piece="fake-kubelet", acts_as=HANDLER_USER)

    def stop(self) -> None:
        if self.kubelet is not None:
            self.kubelet.stop()
            log.info("devcluster.stopped", piece="fake-kubelet")
            self.kubelet = None

    def controller_work(self) -> dict[str, float]:
        """So far, from virt-controller's own metrics: its VM workers' busy seconds ("work"), and its VMI creates'
        and patches' count and seconds ("CREATE count", "PATCH sum", ...). For benches that explain its time."""
        if self._controller_metrics is None:
            raise RuntimeError("virt-controller has not started")
        url, ca = self._controller_metrics
        with urllib.request.urlopen(url, context=ssl.create_default_context(cafile=str(ca)), timeout=10) as answer:
            text: str = answer.read().decode()
        got: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith(VM_WORK + " "):
                got["work"] = float(line.rsplit(" ", 1)[1])
            elif m := VMI_CALLS.match(line):
                got[f"{m[3]} {m[1]}"] = got.get(f"{m[3]} {m[1]}", 0.0) + float(m[4])
        return got

    # -- pieces ----------------------------------------------------------------

    def _token_kubeconfig(self, kube: Kube, service_account: str, path: Path) -> Path:
        token = kube.request_token(NAMESPACE, service_account)
        user = f"system:serviceaccount:{NAMESPACE}:{service_account}"
        return self._plane.write_token_kubeconfig(path, user, token, namespace=NAMESPACE)

    def _handler_identity(self, kube: Kube) -> None:
        rbac = "rbac.authorization.k8s.io"
        name = "cozy-dev:fake-virt-handler"
        account = {"kind": "ServiceAccount", "name": HANDLER_SA, "namespace": NAMESPACE}
        _apply(
            kube,
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": HANDLER_SA, "namespace": NAMESPACE}},
        )
        _apply(
            kube,
            {"apiVersion": f"{rbac}/v1", "kind": "ClusterRole", "metadata": {"name": name}, "rules": HANDLER_RULES},
        )
        role = {"apiGroup": rbac, "kind": "ClusterRole", "name": name}
        binding = {"apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name}}
        _apply(kube, {**binding, "roleRef": role, "subjects": [account]})

    def _kubevirt_cr(self, kube: Kube) -> None:
        with contextlib.suppress(AlreadyExists):
            kube.create(kinds.KUBEVIRT, kubevirt_cr())
        # virt-operator's status: virt-controller ignores the configuration while the phase is
        # empty, and virt-api denies every VMI without a default architecture.
        status = {"status": {"phase": "Deployed", "defaultArchitecture": "amd64"}}
        kube.patch(kinds.KUBEVIRT, "kubevirt", status, NAMESPACE, subresource="status")

    def _start_scheduler(self) -> None:
        proc = self._plane.processes.spawn(
            "kube-scheduler",
            [
                str(self._scheduler_dir / "kube-scheduler"),
                f"--kubeconfig={self._plane.kubeconfig_path}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                # Unthrottled, as a production scheduler is tuned; the defaults (50 QPS) pace tests.
                "--kube-api-qps=500",
                "--kube-api-burst=1000",
                "--v=1",
            ],
        )
        log.info("devcluster.started", piece="kube-scheduler", pid=proc.pid)

    def _certs(self, piece: str) -> Path:
        """A directory with the control plane's CA and a loopback serving pair from it (ca.crt, tls.*)."""
        certs = self._plane.workdir / piece
        certs.mkdir(exist_ok=True)
        serving = self._plane.ca.serving(["127.0.0.1", "localhost"])
        files = {"ca.crt": self._plane.ca.cert_pem, "tls.crt": serving.cert_pem, "tls.key": serving.key_pem}
        for name, data in files.items():
            (certs / name).write_bytes(data)
        return certs

    def _start_virt_api(self, kube: Kube, deadline: float) -> None:
        certs = self._certs("virt-api")
        port = self._plane.virt_api_port  # chosen before kube-apiserver started: its webhooks get no client cert
        url = f"https://127.0.0.1:{port}"
        kubeconfig = self._token_kubeconfig(kube, API_SA, self._plane.workdir / "virt-api.kubeconfig")
        proc = self._plane.processes.spawn(
            "virt-api",
            [
                str(self._dir / "virt-api"),
                f"--kubeconfig={kubeconfig}",
                "--listen=127.0.0.1",
                f"--port={port}",
                f"--tls-cert-file={certs / 'tls.crt'}",
                f"--tls-key-file={certs / 'tls.key'}",
                # The handler pair serves console and VNC calls only; any pair will do.
                f"--handler-cert-file={certs / 'tls.crt'}",
                f"--handler-key-file={certs / 'tls.key'}",
            ],
        )
        self._plane.processes.wait_until("virt-api", proc, lambda: accepts(port), deadline)
        for body in _dump(self._dir / "kv-dump", "-what=webhooks", f"-url={url}", f"-ca-file={certs / 'ca.crt'}"):
            _apply(kube, body)
        log.info("devcluster.started", piece="virt-api", pid=proc.pid, url=url)

    def _start_virt_controller(self, kube: Kube, deadline: float) -> None:
        certs = self._certs("virt-controller")  # its metrics endpoint serves TLS
        kubeconfig = self._token_kubeconfig(kube, CONTROLLER_SA, self.controller_kubeconfig)
        port = free_port()
        self._controller_metrics = (f"https://127.0.0.1:{port}/metrics", certs / "ca.crt")
        proc = self._plane.processes.spawn(
            "virt-controller",
            [
                str(self._dir / "virt-controller"),
                f"--kubeconfig={kubeconfig}",
                "--listen=127.0.0.1",
                f"--port={port}",
                f"--launcher-image={LAUNCHER_IMAGE}",
                f"--prom-cert-file={certs / 'tls.crt'}",
                f"--prom-key-file={certs / 'tls.key'}",
            ],
        )
        # It works once it leads: its Lease names it.
        self._plane.processes.wait_until("virt-controller", proc, lambda: _leads(kube), deadline)
        log.info("devcluster.started", piece="virt-controller", pid=proc.pid, identity=CONTROLLER_USER)


def _leads(kube: Kube) -> bool:
    lease = kube.get_or_none(kinds.kind("Lease"), "virt-controller", NAMESPACE) or {}
    holder: str = lease.get("spec", {}).get("holderIdentity") or ""
    return bool(holder)
