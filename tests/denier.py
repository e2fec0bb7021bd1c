"""A second admission webhook that denies VMIs after ours has answered (§6.3's scenario).

A small HTTPS server in a thread, with a certificate from our own CA builder, and a
ValidatingWebhookConfiguration selecting VMIs labelled `test.cozy/deny: "true"`.
Validating webhooks run after mutating ones, so the operator's bind has happened.
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

from cozygpu import tls
from cozygpu.kube import kinds
from cozygpu.kube.adapter import Kube

DENY_LABEL = "test.cozy/deny"
NAME = "test-denier"


class _Deny(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        answer = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": review["request"]["uid"], "allowed": False,
                         "status": {"code": 403, "message": "denied by the test's second webhook"}},
        }  # fmt: skip
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def denying_webhook(kube: Kube, directory: Path) -> Iterator[None]:
    ca = tls.Authority("test denier CA")
    leaf = ca.serving(["127.0.0.1"])
    (directory / "d.crt").write_bytes(leaf.cert_pem)
    (directory / "d.key").write_bytes(leaf.key_pem)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Deny)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(directory / "d.crt", directory / "d.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": NAME},
        "webhooks": [{
            "name": "deny.test.cozy",
            "clientConfig": {"url": f"https://127.0.0.1:{port}/deny",
                             "caBundle": base64.b64encode(ca.cert_pem).decode()},
            "rules": [{"apiGroups": ["kubevirt.io"], "apiVersions": ["v1"], "resources": ["virtualmachineinstances"],
                       "operations": ["CREATE"]}],
            "objectSelector": {"matchLabels": {DENY_LABEL: "true"}},
            "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail", "timeoutSeconds": 5,
        }],
    }  # fmt: skip
    kube.create(kinds.VALIDATING_WEBHOOKS, config)
    try:
        yield
    finally:
        kube.delete(kinds.VALIDATING_WEBHOOKS, NAME)
        server.shutdown()
