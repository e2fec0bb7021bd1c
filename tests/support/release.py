"""The operator run from the venv as an installed chart's pod would run (issue 23 item 6): no kubelet runs here.

A pod of the Deployment would have the release's ServiceAccount token, the generated certificate mounted from its
Secret, and the Deployment's environment; `start_pod` gives a child process exactly those (a token from the
TokenRequest API, the Secret's files, the installed Deployment's env with the downward API's values filled in), and
writes the EndpointSlice kube-controller-manager would write for a ready pod, so the API server, routing webhook
calls to a Service's endpoints (`--enable-aggregator-routing`), reaches it through the chart's Service.
EndpointSlices refuse loopback addresses: the pod's address is one of this host's others.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import socket
import struct
from pathlib import Path

from cozygpu.api import kinds
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import Kube
from cozygpu.ports import free_port
from tests.support.harness import OperatorProcess

ENDPOINT_SLICE = kinds.Kind("discovery.k8s.io/v1", "EndpointSlice", "endpointslices", True)
SIOCGIFADDR = 0x8915


def host_address() -> str | None:
    """An IPv4 address of this host outside loopback (a pod's address must be one), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            with contextlib.suppress(OSError):
                raw = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
                address = socket.inet_ntoa(raw[20:24])
                if not address.startswith("127."):
                    return address
    return None


def publish_endpoint(kube: Kube, service: str, namespace: str, address: str, webhook_port: int) -> None:
    """The Service's endpoints, as the endpoint-slice controller writes them for one ready pod at `address`."""
    kube.put_object(
        ENDPOINT_SLICE,
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{service}-pod",
                "namespace": namespace,
                "labels": {"kubernetes.io/service-name": service},
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
            "ports": [{"name": "webhook", "port": webhook_port, "protocol": "TCP"}],
        },
    )


def pod_environment(kube: Kube, release: str, namespace: str, pod: str) -> dict[str, str]:
    """The installed Deployment's container env, the downward API's fields as they would be for `pod`."""
    deployment = kube.get(kinds.kind("Deployment"), release, namespace)
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    fields = {"metadata.name": pod, "metadata.namespace": namespace}
    return {
        e["name"]: e["value"] if "value" in e else fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
        for e in container["env"]
    }


def start_pod(
    plane: ControlPlane,
    release: str,
    namespace: str,
    pod: str,
    address: str,
    directory: Path,
    overrides: dict[str, str] | None = None,
) -> OperatorProcess:
    """`cozygpu run` as pod `pod` of the release, serving its webhooks through the release's Service once ready;
    `overrides`: environment beside the Deployment's (a setting an older chart did not know)."""
    kube = plane.kube()
    directory.mkdir(parents=True, exist_ok=True)
    user = f"system:serviceaccount:{namespace}:{release}"
    token = kube.request_token(namespace, release)
    kubeconfig = plane.write_token_kubeconfig(directory / "kubeconfig", user, token, namespace=namespace)
    secret = kube.get(kinds.kind("Secret"), f"{release}-webhook-tls", namespace)
    certs = directory / "tls"  # the Deployment's `tls` volume
    certs.mkdir(exist_ok=True)
    for name in ("tls.crt", "tls.key"):
        (certs / name).write_bytes(base64.b64decode(secret["data"][name]))
    env = pod_environment(kube, release, namespace, pod)
    port = free_port()
    env.update({"COZYGPU_WEBHOOK_CERT_DIR": str(certs), "COZYGPU_WEBHOOK_PORT": str(port), **(overrides or {})})
    process = OperatorProcess(kubeconfig, directory / "operator.log", env=env).start()
    publish_endpoint(kube, release, namespace, address, port)
    return process
