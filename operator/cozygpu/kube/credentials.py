"""Reads a kubeconfig's current context into plain connection fields, and logs kopf in with them.

kopf logs in through `kopf_login` (runtime.process.handlers' login handler); pykube reads the same
file itself. Kept here so the kubeconfig format is handled in the adapter layer only.
"""

from __future__ import annotations

import base64
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kopf
import yaml


@dataclass(frozen=True)
class Connection:
    server: str
    ca_data: bytes | None = None
    certificate_data: bytes | None = None
    private_key_data: bytes | None = None
    token: str | None = None
    insecure: bool = False
    namespace: str = "default"


def _data(entry: dict[str, Any], key: str, base: Path) -> bytes | None:
    if f"{key}-data" in entry:
        return base64.b64decode(str(entry[f"{key}-data"]))
    if key in entry:
        return (base / str(entry[key])).read_bytes()
    return None


def from_kubeconfig(path: Path) -> Connection:
    config = yaml.safe_load(path.read_text())
    base = path.parent
    current = config["current-context"]
    context = next(c["context"] for c in config["contexts"] if c["name"] == current)
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
    user: dict[str, Any] = next((u["user"] for u in config.get("users", []) if u["name"] == context.get("user")), {})
    return Connection(
        server=cluster["server"],
        ca_data=_data(cluster, "certificate-authority", base),
        certificate_data=_data(user, "client-certificate", base),
        private_key_data=_data(user, "client-key", base),
        token=user.get("token"),
        insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
        namespace=context.get("namespace", "default"),
    )


def in_cluster_server(environ: Mapping[str, str]) -> str | None:
    """The API server as a pod reaches it: the address the kubelet puts in KUBERNETES_SERVICE_HOST and _PORT
    (pykube's in-cluster client uses them too); None outside a pod."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def kopf_login(kubeconfig: Path | None, kopf_kwargs: dict[str, Any]) -> kopf.ConnectionInfo:
    """kopf's connection: the kubeconfig's current context, or without one the in-cluster service account."""
    if kubeconfig is None:
        info = kopf.login_with_service_account(**kopf_kwargs)
        if info is None:
            raise kopf.LoginError("no kubeconfig given and no in-cluster service account found")
        # kopf dials kubernetes.default.svc, which needs cluster DNS (none with hostNetwork and no
        # ClusterFirstWithHostNet); the adapter dials the kubelet's address. One API server for both.
        server = in_cluster_server(os.environ)
        return info if server is None else dataclasses.replace(info, server=server)
    conn = from_kubeconfig(kubeconfig)
    return kopf.ConnectionInfo(
        server=conn.server,
        ca_data=conn.ca_data,
        certificate_data=conn.certificate_data,
        private_key_data=conn.private_key_data,
        token=conn.token,
        insecure=conn.insecure,
        default_namespace=conn.namespace,
    )
