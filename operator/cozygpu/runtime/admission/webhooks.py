"""Serving the admission webhooks: TLS material, the kopf server, the configurations.

In a cluster the Helm chart mounts the certificate and installs the configurations;
with `--dev` the operator makes a self-signed certificate, registers configurations
pointing at itself and removes them on exit. The builders here return objects; the
Operator writes them.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import hashlib
import json
import ssl
import tempfile
import time
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp.web
import kopf
import structlog

from cozygpu import tls
from cozygpu.api import hooks
from cozygpu.api.names import (
    KUBEVIRT_DEVICES,
    LABEL_DEVICE_REFERENCE,
    LABEL_KUBEVIRT,
    LABEL_WEBHOOKS,
    LAUNCHER,
    TRUE,
)
from cozygpu.runtime.admission import doorway
from cozygpu.settings import Settings

log = structlog.get_logger("cozygpu.webhook")

CONFIGURATION_NAME = "cozy-gpu-operator"
# The API server calls mutating configurations in the order of their names: ours sorts after KubeVirt's
# (virt-api-mutator), so it sees a VMI with virt-api's defaults in place and is called once per VMI, not again
# after virt-api changed it. Nothing relies on the order: reinvocationPolicy IfNeeded stays (§3).
MUTATING_PREFIX = "zz-"
MUTATING_NAME = MUTATING_PREFIX + CONFIGURATION_NAME

# Handler ids (api.hooks, the one table); kopf serves each at /<id>.
VMI_HOOK, POD_HOOK = hooks.VMI.id, hooks.POD.id
DEVICE_HOOK, CLASS_HOOK, BUDGET_HOOK = hooks.DEVICE.id, hooks.CLASS.id, hooks.BUDGET.id

LAUNCHER_SELECTOR = {LABEL_KUBEVIRT: LAUNCHER}


def _asks_extended(containers: str) -> str:
    ask = f"r.contains('/') && !r.startsWith('{KUBEVIRT_DEVICES}')"
    per_field = [f"(has(c.resources.{f}) && c.resources.{f}.exists(r, {ask}))" for f in ("requests", "limits")]
    return f"{containers}.exists(c, has(c.resources) && ({' || '.join(per_field)}))"


# Only pods asking for an extended resource other than KubeVirt's own reach the pod webhook
# (§12.3): whether it is a managed GPU resource is the operator's to say, from its classes.
ASKS_EXTENDED = (
    f"{_asks_extended('object.spec.containers')} || "
    f"(has(object.spec.initContainers) && {_asks_extended('object.spec.initContainers')})"
)


# The uid of the AdmissionReview being answered (kopf hands its handlers the object, not the review): what one
# admission reserves is keyed by it (§7.4), and every log line of the review names it.
REVIEW_UID: contextvars.ContextVar[str] = contextvars.ContextVar("cozygpu_review_uid", default="")

HOOKS = frozenset(hook.id for hook in hooks.HOOKS)
# What the API server may send: etcd stores objects up to 1.5 MiB, and a review carries the object and
# its old version; aiohttp's default would cut bodies at 1 MiB.
MAX_REVIEW_BYTES = 4 * 1024 * 1024
# The API server writes a review at once: a body still arriving after this long is from no caller worth waiting
# for, and waiting longer would let it hold a replica's drain past the pod's grace period (§10).
BODY_WITHIN = 10.0
# How long a connection serves reviews before an answer closes it (§10; the setting's default, and the dev server's).
CONNECTION_LIFE = 30.0
DEFAULT_LIMITS = doorway.Limits()


def envelope_problem(review: Any) -> str | None:
    """What makes a decoded body no AdmissionReview request we can answer, naming the field; None if fine."""
    inner = review.get("request") if isinstance(review, dict) else None
    if not isinstance(inner, dict):
        return "the body is not an AdmissionReview: no request object"
    uid = inner.get("uid")
    if not isinstance(uid, str) or not uid:
        return "request.uid is missing or not a string"
    for field in ("resource", "userInfo"):
        if not isinstance(inner.get(field), dict):
            return f"request.{field} is missing or not an object"
    for part in ("group", "version", "resource"):
        if not isinstance(inner["resource"].get(part), str):
            return f"request.resource.{part} is missing or not a string"
    for field in ("operation", "subResource"):
        if inner.get(field) is not None and not isinstance(inner[field], str):
            return f"request.{field} is not a string"
    if "dryRun" in inner and not isinstance(inner["dryRun"], bool | None):
        return "request.dryRun is not a boolean"
    for field in ("object", "oldObject"):
        value = inner.get(field)
        if value is not None and not isinstance(value, dict):
            return f"request.{field} is not an object"
        if isinstance(value, dict) and not isinstance(value.get("metadata", {}), dict):
            return f"request.{field}.metadata is not an object"
    if inner.get("object") is None and inner.get("oldObject") is None:
        return "request.object and request.oldObject are both missing"
    # §14.1: the API server sets an object's namespace from the request's before admission; a review whose two
    # disagree was not sent by it, and the handlers must never act in a namespace the request did not name.
    namespace = inner.get("namespace") or ""
    if not isinstance(namespace, str):
        return "request.namespace is not a string"
    for field in ("object", "oldObject"):
        value = inner.get(field)
        theirs = (value.get("metadata") or {}).get("namespace") or "" if isinstance(value, dict) else namespace
        if theirs != namespace:
            return f"request.{field}.metadata.namespace is not request.namespace"
    return None


class ReviewServer(kopf.WebhookServer):
    """kopf's server, answering what is not an AdmissionReview request for one of our hooks as the HTTP error it
    is (400 naming the field, 404 for a path no hook serves) rather than 500 or an allowed answer (§3). While
    `closing` says so (a replica draining before it stops, §10) every answer closes its connection, so the API
    server's next request opens one to a replica that stays; so does the first answer on a connection older than
    `connection_life`: the API server keeps its connections and reuses them, and a replica that joins would get
    none while they last. A body not read within `read_within` is answered 408: a caller that sends half a body
    and stops would otherwise hold a replica's drain for 60 s."""

    closing: Callable[[], bool] = staticmethod(lambda: False)
    read_within: float = BODY_WITHIN
    connection_life: float = CONNECTION_LIFE
    limits: doorway.Limits = DEFAULT_LIMITS
    refused: Callable[[str], None] = staticmethod(lambda reason: None)  # a connection turned away, and why

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        # When each open connection (its transport) brought its first request; forgotten as it closes.
        self._born: weakref.WeakKeyDictionary[asyncio.BaseTransport, float] = weakref.WeakKeyDictionary()
        self.doorway: doorway.Doorway | None = None  # while serving

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        """Serve until cancelled, through a `Doorway` (§14.1) rather than kopf's own TCP site; a renewed certificate
        (the files changed) serves the connections from then on, with no gap in listening."""

        async def serve(request: aiohttp.web.Request) -> aiohttp.web.Response:
            return await self._serve(fn, request)

        cadata, context = self._build_ssl()
        if context is None:
            raise ValueError("the webhook server serves TLS only")
        app = aiohttp.web.Application()
        app.add_routes([aiohttp.web.post("/{id:.*}", serve)])
        runner = aiohttp.web.AppRunner(app, handle_signals=False)
        await runner.setup()
        try:
            door = self.doorway = doorway.Doorway(
                runner,
                self.addr or None,
                self.port or 9443,
                context,
                self.limits,
                refused=self._turned_away,
            )
            await door.start()
            config: dict[str, Any] = {"url": f"https://{self.host or self.addr}:{self.port}"}
            if cadata is not None:
                config["caBundle"] = base64.b64encode(cadata).decode()
            yield config
            async for context in self._renewed():
                door.context = context
        finally:
            await runner.cleanup()

    def _turned_away(self, reason: str) -> None:
        self.refused(reason)  # looked up when told: set after the server started, as the tests do

    async def _renewed(self) -> AsyncIterator[ssl.SSLContext]:
        """A new context each time the certificate's files change (checked every `file_check_interval`: a mounted
        Secret's files change with no event to watch)."""
        seen = _digest(self.certfile, self.pkeyfile)
        while True:
            await asyncio.sleep(self.file_check_interval)
            try:
                now = _digest(self.certfile, self.pkeyfile)
                if now == seen:
                    continue
                _, context = self._build_ssl()
            except (OSError, ssl.SSLError) as e:  # a rotation half-way: the old context serves on
                log.warning("webhook.certificate_unreadable", error=str(e))
                continue
            seen = now
            if context is not None:
                log.info("webhook.certificate_renewed")
                yield context

    def _aged(self, request: aiohttp.web.Request) -> bool:
        """Whether the request's connection has lived `connection_life`, timed from its first request."""
        transport = request.transport
        if transport is None:
            return True
        now = time.monotonic()
        return now - self._born.setdefault(transport, now) >= self.connection_life

    async def _serve(self, fn: Any, request: aiohttp.web.Request) -> aiohttp.web.Response:  # type: ignore[override]
        if request.match_info.get("id") not in HOOKS:
            raise aiohttp.web.HTTPNotFound(reason="no webhook is served at this path")
        request = request.clone(client_max_size=MAX_REVIEW_BYTES)
        try:
            async with asyncio.timeout(self.read_within):
                text = await request.text()
        except TimeoutError:
            return await _answer_and_close(request, 408, "the review's body did not arrive in time")
        try:
            review = json.loads(text)
        except (ValueError, RecursionError):
            raise aiohttp.web.HTTPBadRequest(reason="the body is not JSON") from None
        problem = envelope_problem(review)
        if problem is not None:
            raise aiohttp.web.HTTPBadRequest(reason=problem)
        uid = review["request"]["uid"]
        token = REVIEW_UID.set(uid)
        try:
            with structlog.contextvars.bound_contextvars(review=uid):
                response: aiohttp.web.Response = await kopf.WebhookServer._serve(fn, request)
        finally:
            REVIEW_UID.reset(token)
        if self.closing() or self._aged(request):
            response.force_close()
        return response


def _digest(*paths: Any) -> str:
    hasher = hashlib.sha256()
    for path in paths:
        if path is not None:
            hasher.update(Path(path).read_bytes())
    return hasher.hexdigest()


async def _answer_and_close(request: aiohttp.web.Request, status: int, reason: str) -> aiohttp.web.Response:
    """Answer, then close the connection at once: aiohttp would otherwise go on reading the rest of the body for
    10 s (its lingering close), holding a drain that long."""
    answer = aiohttp.web.Response(status=status, reason=reason, text=reason)
    answer.force_close()
    await answer.prepare(request)
    await answer.write_eof()
    if request.protocol is not None:
        request.protocol.force_close()  # the answer is written; the transport sends it before closing
    return answer


@dataclass(frozen=True)
class Serving:
    server: ReviewServer
    url: str
    ca_bundle: bytes


def _clients_of(client_ca: bytes | None) -> dict[str, Any]:
    """§14.1: with a CA, the TLS handshake itself turns away a caller without a certificate it signed."""
    if client_ca is None:
        return {}
    return {"verify_mode": ssl.CERT_REQUIRED, "verify_cadata": client_ca.decode()}


def limits_of(settings: Settings) -> doorway.Limits:
    return doorway.Limits(peer_connections=settings.webhook_peer_connections, handshakes=settings.webhook_handshakes)


def dev_serving(
    host: str,
    port: int,
    client_ca: bytes | None = None,
    *,
    read_within: float = BODY_WITHIN,
    connection_life: float = CONNECTION_LIFE,
    limits: doorway.Limits = DEFAULT_LIMITS,
) -> Serving:
    """A self-signed CA and a serving certificate for `host`, in a private temporary directory."""
    directory = Path(tempfile.mkdtemp(prefix="cozygpu-webhook-"))
    ca = tls.Authority("cozy-gpu-operator webhook CA (dev)")
    leaf = ca.serving([host, "localhost"])
    cert, key = directory / "tls.crt", directory / "tls.key"
    cert.write_bytes(leaf.cert_pem)
    key.write_bytes(leaf.key_pem)
    key.chmod(0o600)
    server = ReviewServer(
        addr=host, port=port, host=host, certfile=str(cert), pkeyfile=str(key), **_clients_of(client_ca)
    )
    server.read_within = read_within
    server.connection_life = connection_life
    server.limits = limits
    return Serving(server, f"https://{host}:{port}", ca.cert_pem)


def cluster_serving(settings: Settings, client_ca: bytes | None, closing: Callable[[], bool]) -> ReviewServer:
    """The chart's mounted certificate (tls.crt, tls.key); a renewed one serves once its files change. `closing`
    says when the replica drains."""
    server = ReviewServer(
        addr=settings.webhook_host,
        port=settings.webhook_port or 9443,
        certfile=str(settings.webhook_cert_dir / "tls.crt"),
        pkeyfile=str(settings.webhook_cert_dir / "tls.key"),
        **_clients_of(client_ca),
    )
    server.closing = closing
    server.connection_life = settings.webhook_connection_life
    server.limits = limits_of(settings)
    return server


def _client(url: str, hook: str, ca_bundle: bytes) -> dict[str, Any]:
    return {"url": f"{url}/{hook}", "caBundle": base64.b64encode(ca_bundle).decode()}


def _rule(hook: hooks.Hook) -> dict[str, Any]:
    return {**hook.rule(), "scope": "*"}


def not_from(username: str) -> list[dict[str, str]]:
    """A CEL matchCondition that skips the operator's own requests.

    The operator enforces §9; its own writes (finalizers, owners, template devices) must not wait
    on its own webhook, or a restart, an upgrade or a crash would stop it from cleaning up."""
    return [{"name": "not-the-operator", "expression": f"request.userInfo.username != {json.dumps(username)}"}]


# The longest wait of every hook but the VMI's, which alone may wait on the binder.
SHORT_TIMEOUT = 10


def configurations(
    url: str, ca_bundle: bytes, timeout: float, operator_user: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Mutating (VMIs, launcher pods) and Validating (our kinds) configurations of §3, §9, §10 and §12."""
    seconds = int(timeout)
    common = {"admissionReviewVersions": ["v1"], "failurePolicy": "Fail", "matchPolicy": "Equivalent"}
    mutating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        # The label: the no-bypass policy finds it by it (runtime.admission.policy.webhooks_binding).
        "metadata": {"name": MUTATING_NAME, "labels": {LABEL_WEBHOOKS: TRUE}},
        "webhooks": [
            {
                "name": hooks.VMI.webhook,
                "clientConfig": _client(url, VMI_HOOK, ca_bundle),
                "rules": [_rule(hooks.VMI)],
                # Only VMIs with device references wait on the operator (§10).
                "objectSelector": {"matchLabels": {LABEL_DEVICE_REFERENCE: TRUE}},
                "reinvocationPolicy": "IfNeeded",
                "sideEffects": "NoneOnDryRun",
                "timeoutSeconds": seconds,
                **common,
            },
            {
                # §12.2: the pin that holds is on the pod, which KubeVirt cannot rewrite once created.
                "name": hooks.POD.webhook,
                "clientConfig": _client(url, POD_HOOK, ca_bundle),
                "rules": [_rule(hooks.POD)],
                "objectSelector": {"matchLabels": dict(LAUNCHER_SELECTOR)},
                "matchConditions": [{"name": "asks-for-an-extended-resource", "expression": ASKS_EXTENDED}],
                "reinvocationPolicy": "IfNeeded",
                "sideEffects": "None",
                "timeoutSeconds": min(seconds, SHORT_TIMEOUT),
                **common,
            },
        ],
    }
    validating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": CONFIGURATION_NAME},
        "webhooks": [
            {
                "name": hook.webhook,
                "clientConfig": _client(url, hook.id, ca_bundle),
                "rules": [_rule(hook)],
                "matchConditions": not_from(operator_user),
                "sideEffects": "None",
                "timeoutSeconds": min(seconds, SHORT_TIMEOUT),
                **common,
            }
            for hook in hooks.HOOKS
            if not hook.mutating
        ],
    }
    return mutating, validating
