"""Second admission webhooks for scenarios that need one, served by the tests themselves.

`denying_webhook`: a validating webhook that denies VMIs labelled
`test.cozy/deny: "true"`; validating webhooks run after mutating ones, so the
operator's bind has happened (§6.3's scenario). `labelling_webhook`: a mutating
webhook, ordered after ours, that adds a label to VMIs labelled
`test.cozy/relabel: "true"`, so the API server reinvokes ours (§3's reinvocation).
Each is a small HTTPS server in a thread with a certificate from our own CA builder.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cozygpu import tls
from cozygpu.api import hooks, kinds
from cozygpu.kube.adapter import Kube
from tests.support.harness import wait_for

DENY_LABEL = "test.cozy/deny"
RELABEL_LABEL = "test.cozy/relabel"
NAME = "test-denier"
LABELLER = "zz-test-labeller"  # configurations are called in name order: after zz-cozy-gpu-operator


def _deny(uid: str) -> dict[str, Any]:
    return {"uid": uid, "allowed": False, "status": {"code": 403, "message": "denied by the test's second webhook"}}


def _relabel(uid: str) -> dict[str, Any]:
    patch = [{"op": "add", "path": "/metadata/labels/test.cozy~1relabelled", "value": "yes"}]
    return {
        "uid": uid,
        "allowed": True,
        "patchType": "JSONPatch",
        "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
    }


class _Hook(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        answer_fn = _deny if self.path.startswith("/deny") else _relabel  # the API server adds ?timeout=
        answer = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": answer_fn(review["request"]["uid"]),
        }
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def _serving(directory: Path) -> Iterator[tuple[int, bytes]]:
    ca = tls.Authority("test webhook CA")
    leaf = ca.serving(["127.0.0.1"])
    (directory / "d.crt").write_bytes(leaf.cert_pem)
    (directory / "d.key").write_bytes(leaf.key_pem)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(directory / "d.crt", directory / "d.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], ca.cert_pem
    finally:
        server.shutdown()


def _rule() -> dict[str, Any]:
    return hooks.VMI.rule()  # the VMI creates our own hook sees (api.hooks, the one table)


@contextmanager
def labelling_webhook(kube: Kube, directory: Path) -> Iterator[None]:
    with _serving(directory) as (port, ca):
        config = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": LABELLER},
            "webhooks": [
                {
                    "name": "relabel.test.cozy",
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{port}/relabel",
                        "caBundle": base64.b64encode(ca).decode(),
                    },
                    "rules": [_rule()],
                    "objectSelector": {"matchLabels": {RELABEL_LABEL: "true"}},
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 5,
                    "reinvocationPolicy": "Never",
                }
            ],
        }
        kube.create(kinds.MUTATING_WEBHOOKS, config)
        try:
            # The API server calls a configuration once its own cache has it, a moment after the create: until a
            # dry run comes back relabelled, a VMI would be created without the labeller.
            wait_for("the labeller called", lambda: _relabelled(kube), timeout=15)
            yield
        finally:
            kube.delete(kinds.MUTATING_WEBHOOKS, LABELLER)


def _relabelled(kube: Kube) -> bool:
    """A dry-run create of a VMI the labeller selects (and no webhook of ours does) comes back relabelled."""
    meta = {"name": "labeller-probe", "namespace": "default", "labels": {RELABEL_LABEL: "true"}}
    domain = {"devices": {}, "resources": {"requests": {"memory": "1Gi"}}}
    probe = {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": meta,
        "spec": {"domain": domain},
    }
    created = kube.create(kinds.VMI, probe, dry_run=True)
    return created["metadata"].get("labels", {}).get("test.cozy/relabelled") == "yes"


@contextmanager
def denying_webhook(kube: Kube, directory: Path) -> Iterator[None]:
    with _serving(directory) as (port, ca_pem):
        config = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": NAME},
            "webhooks": [
                {
                    "name": "deny.test.cozy",
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{port}/deny",
                        "caBundle": base64.b64encode(ca_pem).decode(),
                    },
                    "rules": [_rule()],
                    "objectSelector": {"matchLabels": {DENY_LABEL: "true"}},
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 5,
                }
            ],
        }
        kube.create(kinds.VALIDATING_WEBHOOKS, config)
        try:
            yield
        finally:
            kube.delete(kinds.VALIDATING_WEBHOOKS, NAME)
