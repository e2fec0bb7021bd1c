"""etcd and kube-apiserver on loopback, with our CRDs and KubeVirt's installed.

`ControlPlane` is a context manager: `start()` returns once /readyz is ok and the
CRDs are established; `stop()` ends both processes and removes the data. Used by
the pytest fixtures (tests/conftest.py) and `cozygpu dev-cluster`.

Why one module: the control plane's processes, certificates, kubeconfigs and readiness are one
lifecycle; process supervision shared with devcluster.kubevirt is issue 35 item 8's to move out.
"""

from __future__ import annotations

import base64
import contextlib
import shutil
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import requests
import yaml

from cozygpu import tls
from cozygpu.api import KINDS, crdgen, kinds
from cozygpu.api.names import DEV_NAMESPACE, DEV_WEBHOOK_CLIENT_CA
from cozygpu.devcluster import binaries
from cozygpu.devcluster.kubevirt import KubeVirt
from cozygpu.devcluster.processes import Processes
from cozygpu.kube.adapter import AlreadyExists, Kube
from cozygpu.ports import free_port

KUBEVIRT_CRDS = binaries.repo_root() / "tests" / "fixtures" / "kubevirt" / "crds.yaml"
SERVICE_CIDR = "10.0.0.0/24"


class ControlPlaneError(RuntimeError):
    """The control plane started, but what it serves (our CRDs, KubeVirt's) did not become ready."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def kubeconfig(
    server: str, ca: bytes, credentials: dict[str, str], user: str = "admin", namespace: str = "default"
) -> dict[str, Any]:
    """A kubeconfig for this server; `credentials` is the user entry (client certificate or token)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cozy-dev", "cluster": {"server": server, "certificate-authority-data": _b64(ca)}}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "cozy-dev", "context": {"cluster": "cozy-dev", "user": user, "namespace": namespace}}],
        "current-context": "cozy-dev",
    }


def client_certificate(client: tls.KeyPair) -> dict[str, str]:
    return {"client-certificate-data": _b64(client.cert_pem), "client-key-data": _b64(client.key_pem)}


def crd_manifests(*, ours: bool = True) -> list[dict[str, Any]]:
    """Our CRDs (straight from the models; unless `ours` is False) and all of KubeVirt's (from the test fixtures)."""
    mine = [crdgen.crd(k) for k in KINDS] if ours else []
    # 4 MB of YAML: libyaml's loader reads it in a second, the pure-Python one in six.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    theirs = [d for d in yaml.load_all(KUBEVIRT_CRDS.read_text(), Loader=loader) if d]
    return mine + theirs


class ControlPlane:
    def __init__(
        self,
        bin_dir: Path | None = None,
        *,
        workdir: Path | None = None,
        verbose: bool = False,
        controllers: tuple[str, ...] = (),
        kubevirt: bool = False,
        ours: bool = True,
        apiserver_flags: tuple[str, ...] = (),
    ) -> None:
        """`controllers`: kube-controller-manager controllers to run too (e.g. garbagecollector, namespace).

        `kubevirt`: KubeVirt in the loop as well (§11.1): kube-scheduler, virt-api, virt-controller
        and a fake kubelet; raises `binaries.BinariesUnavailable` saying why when they cannot be had.
        `ours` False: our CRDs are left to the caller (the chart's install). `apiserver_flags`: more for
        kube-apiserver."""
        self._ours, self._apiserver_flags = ours, apiserver_flags
        self._bin_dir = bin_dir
        self._controllers = controllers
        self._with_kubevirt = kubevirt
        self.kubevirt: KubeVirt | None = None
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="cozygpu-cp-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._verbose = verbose
        self.processes = Processes(self.workdir)
        self.ca = tls.Authority("cozy-dev control plane CA")
        # §14.1: the API server presents a client certificate of this CA to every webhook it calls.
        self.webhook_ca = tls.Authority("cozy-dev webhook client CA")
        # virt-api's port, known before kube-apiserver starts: virt-api checks client certificates against the
        # cluster's CA, so the API server presents it none (`_admission_config`).
        self.virt_api_port = free_port() if kubevirt else 0
        self.server = ""
        self.etcd_url = ""
        self.kubeconfig_path = self.workdir / "kubeconfig"

    # -- lifecycle ---------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self, timeout: float = 120.0) -> None:
        try:
            extra: tuple[str, ...] = ("kube-controller-manager",) if self._controllers else ()
            if self._with_kubevirt:
                extra += ("kube-scheduler",)
            bin_dir = self._bin_dir or binaries.find(extra)
            kubevirt_dir = binaries.find_kubevirt() if self._with_kubevirt else None
            deadline = time.monotonic() + timeout
            etcd_url = self._start_etcd(bin_dir, deadline)
            self._start_apiserver(bin_dir, etcd_url, deadline)
            self.install_crds(deadline)
            self.publish_webhook_client_ca()
            if self._controllers:
                self._start_controller_manager(bin_dir)
            if kubevirt_dir is not None:
                self.kubevirt = KubeVirt(self, bin_dir, kubevirt_dir)
                self.kubevirt.start(deadline)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.kubevirt is not None:
            self.kubevirt.stop()
            self.kubevirt = None
        self.processes.stop_all()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- clients -----------------------------------------------------------

    def kube(self) -> Kube:
        return Kube.from_kubeconfig(self.kubeconfig_path)

    def write_kubeconfig(self, path: Path, user: str = "admin", group: str | None = "system:masters") -> Path:
        """A kubeconfig for `user` with a client certificate from this control plane's CA."""
        credentials = client_certificate(self.ca.client(user, group))
        return self._write(path, kubeconfig(self.server, self.ca.cert_pem, credentials, user))

    def write_token_kubeconfig(self, path: Path, user: str, token: str, namespace: str = "default") -> Path:
        """A kubeconfig that authenticates with a bearer token (a ServiceAccount's, say)."""
        return self._write(path, kubeconfig(self.server, self.ca.cert_pem, {"token": token}, user, namespace))

    @staticmethod
    def _write(path: Path, config: dict[str, Any]) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def _start_etcd(self, bin_dir: Path, deadline: float) -> str:
        client, peer = free_port(), free_port()
        url = f"http://127.0.0.1:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        proc = self.processes.spawn(
            "etcd",
            [
                str(bin_dir / "etcd"),
                "--name=default",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self.processes.wait_until("etcd", proc, lambda: requests.get(f"{url}/health", timeout=1).ok, deadline)
        self.etcd_url = url
        return url

    def _start_apiserver(self, bin_dir: Path, etcd_url: str, deadline: float) -> None:
        certs = self.workdir / "certs"
        certs.mkdir(exist_ok=True)
        serving = self.ca.serving(["127.0.0.1", "localhost"])
        sa = tls.service_account_key()
        files = {
            "ca.crt": self.ca.cert_pem,
            "apiserver.crt": serving.cert_pem,
            "apiserver.key": serving.key_pem,
            "sa.pub": sa.cert_pem,
            "sa.key": sa.key_pem,
        }
        for name, data in files.items():
            (certs / name).write_bytes(data)
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        self.apiserver_argv = [
            str(bin_dir / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            f"--cert-dir={certs}",
            f"--secure-port={port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--disable-admission-plugins=ServiceAccount",
            "--authorization-mode=RBAC",
            "--allow-privileged=true",
            f"--client-ca-file={certs / 'ca.crt'}",
            f"--tls-cert-file={certs / 'apiserver.crt'}",
            f"--tls-private-key-file={certs / 'apiserver.key'}",
            f"--service-account-issuer={self.server}",
            f"--service-account-key-file={certs / 'sa.pub'}",
            f"--service-account-signing-key-file={certs / 'sa.key'}",
            # Aggregation's front-proxy CA: virt-api reads it from extension-apiserver-authentication.
            f"--requestheader-client-ca-file={certs / 'ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            "--profiling=false",
            f"--admission-control-config-file={self._admission_config(certs)}",
            f"--v={4 if self._verbose else 1}",
            *self._apiserver_flags,
        ]
        proc = self.processes.spawn("kube-apiserver", self.apiserver_argv)
        self.write_kubeconfig(self.kubeconfig_path)
        kube = self.kube()
        self.processes.wait_until("kube-apiserver", proc, lambda: kube.raw_get("/readyz").ok, deadline)

    def _admission_config(self, certs: Path) -> Path:
        """The AdmissionConfiguration under which the API server presents its webhook client certificate to
        every webhook ("*") but virt-api's, as Kubernetes documents for webhooks that authenticate the API server."""
        client = self.webhook_ca.client("kube-apiserver-webhook-client")
        users = [{"name": "*", "user": client_certificate(client)}]
        if self.virt_api_port:
            users.append({"name": f"127.0.0.1:{self.virt_api_port}", "user": {}})
        users_file = self._write(
            certs / "webhook-client.kubeconfig", {"apiVersion": "v1", "kind": "Config", "users": users}
        )
        plugin = {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "WebhookAdmissionConfiguration",
            "kubeConfigFile": str(users_file),
        }
        return self._write(
            certs / "admission.yaml",
            {
                "apiVersion": "apiserver.config.k8s.io/v1",
                "kind": "AdmissionConfiguration",
                "plugins": [
                    {"name": name, "configuration": plugin}
                    for name in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")
                ],
            },
        )

    def publish_webhook_client_ca(self) -> None:
        """Where `cozygpu run --dev` finds the CA to require of webhook callers (api.names.DEV_WEBHOOK_CLIENT_CA)."""
        kube = self.kube()
        kube.put_object(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DEV_NAMESPACE}})
        kube.put_object(
            kinds.kind("ConfigMap"),
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": DEV_WEBHOOK_CLIENT_CA, "namespace": DEV_NAMESPACE},
                "data": {"ca.crt": self.webhook_ca.cert_pem.decode()},
            },
        )

    def _start_controller_manager(self, bin_dir: Path) -> None:
        """Owner-reference garbage collection and namespace deletion, as in a cluster."""
        self.processes.spawn(
            "kube-controller-manager",
            [
                str(bin_dir / "kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig_path}",
                f"--controllers={','.join(self._controllers)}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                f"--v={4 if self._verbose else 1}",
            ],
        )

    def install_crds(self, deadline: float) -> None:
        kube = self.kube()
        manifests = crd_manifests(ours=self._ours)
        for manifest in manifests:
            with contextlib.suppress(AlreadyExists):
                kube.create(kinds.CRD, manifest)
        pending = {m["metadata"]["name"] for m in manifests}
        while pending and time.monotonic() < deadline:
            for name in sorted(pending):
                conditions = kube.get(kinds.CRD, name).get("status", {}).get("conditions") or []
                if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                    pending.discard(name)
            if pending:
                time.sleep(0.1)
        if pending:
            raise ControlPlaneError(f"CRDs not established in time: {', '.join(sorted(pending))}")
        # Established is not yet servable: the watch cache answers 503 "storage is
        # (re)initializing" for a moment. Ready means a list of every kind works.
        for manifest in manifests:
            spec = manifest["spec"]
            group, plural = spec["group"], spec["names"]["plural"]
            version = next(v["name"] for v in spec["versions"] if v.get("storage"))
            path = f"/apis/{group}/{version}/{plural}?limit=1"
            while not kube.raw_get(path).ok:
                if time.monotonic() > deadline:
                    raise ControlPlaneError(f"{plural}.{group} not served in time")
                time.sleep(0.1)
