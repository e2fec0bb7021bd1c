"""How kopf runs for us and where it serves the admission webhooks from (§10, §14.1).

Called by the Operator (runtime.process.app) at start-up, before kopf starts serving: `client_ca` finds the
CA whose client certificates may call the webhooks (the setting's file, or with --dev the one a dev control
plane publishes); `configure` sets kopf's settings for objects we do not own and chooses its webhook server:
the chart's mounted certificate in a cluster (drained while `closing` says so), a self-signed one with --dev
(registered by runtime.admission.registration), none when webhooks are off.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import kopf
import structlog

from cozygpu.api import kinds
from cozygpu.api.names import DEV_NAMESPACE, DEV_WEBHOOK_CLIENT_CA
from cozygpu.kube.adapter import ApiError, AsyncKube
from cozygpu.ports import free_port
from cozygpu.runtime.admission import webhooks
from cozygpu.runtime.admission.registration import Registration
from cozygpu.settings import Settings

log = structlog.get_logger("cozygpu.operator")


async def client_ca(settings: Settings, kube: AsyncKube) -> bytes | None:
    """§14.1: the CA whose client certificates may call the webhooks; without one the port serves any caller, and
    the log says so."""
    if settings.webhook_mode == "off":
        return None
    ca: bytes | None = None
    if settings.webhook_client_ca is not None:
        ca = settings.webhook_client_ca.read_bytes()
    elif settings.webhook_mode == "dev":
        try:
            published = await kube.get_or_none(kinds.kind("ConfigMap"), DEV_WEBHOOK_CLIENT_CA, DEV_NAMESPACE)
        except ApiError as e:  # a restricted identity (--as-given) may not read it
            log.warning("webhook.client_ca_unreadable", error=e.message)
            published = None
        text = ((published or {}).get("data") or {}).get("ca.crt")
        ca = text.encode() if isinstance(text, str) and text else None
    if ca is None:
        log.warning("webhook.open", reason="no client CA: any caller that reaches the webhook port is served")
    else:
        log.info("webhook.client_ca", required=True)
    return ca


def configure(
    kopf_settings: kopf.OperatorSettings,
    settings: Settings,
    registration: Registration,
    ca: bytes | None,
    *,
    closing: Callable[[], bool],
    refused: Callable[[str], None],
) -> None:
    """kopf's settings, and its webhook server for the mode; `refused` is told of each connection the webhook port
    turned away (§14.1)."""
    # We watch objects we do not own: no events posted about them, no progress stored.
    kopf_settings.posting.enabled = False
    kopf_settings.scanning.disabled = True
    kopf_settings.watching.server_timeout = 300
    kopf_settings.watching.reconnect_backoff = 0.5
    logging.getLogger("kopf").setLevel(logging.WARNING)
    if settings.webhook_mode == "dev":
        host = "127.0.0.1"
        registration.serving = webhooks.dev_serving(
            host,
            settings.webhook_port or free_port(host),
            ca,
            connection_life=settings.webhook_connection_life,
            limits=webhooks.limits_of(settings),
        )
        registration.serving.server.refused = refused
        kopf_settings.admission.server = registration.serving.server
    elif settings.webhook_mode == "cluster":
        server = webhooks.cluster_serving(settings, ca, closing)
        server.refused = refused
        kopf_settings.admission.server = server
