"""How the operator configures its webhook server (runtime.process.serving): the server of each mode serves with
the settings' connection life and the door's limits, whichever mode chose it."""

from __future__ import annotations

from pathlib import Path

import kopf
import pytest

from cozygpu.runtime.admission.registration import Registration
from cozygpu.runtime.admission.webhooks import ReviewServer
from cozygpu.runtime.process import serving
from cozygpu.settings import Settings


@pytest.mark.parametrize("mode", ["dev", "cluster"])
def test_each_mode_serves_with_the_settings_connection_life_and_limits(mode: str, tmp_path: Path) -> None:
    """`--dev` kept connections 30 s whatever COZYGPU_WEBHOOK_CONNECTION_LIFE said; both modes now take it, and
    the door's caps, from the settings."""
    settings = Settings(
        webhook_mode=mode,
        webhook_port=9555,
        webhook_cert_dir=tmp_path,
        webhook_connection_life=7.0,
        webhook_peer_connections=9,
        webhook_handshakes=2,
    )
    kopf_settings = kopf.OperatorSettings()
    told: list[str] = []
    registration = Registration(settings, kube=None, namespace="cozy-gpu")  # type: ignore[arg-type]  # not called
    serving.configure(kopf_settings, settings, registration, None, closing=lambda: False, refused=told.append)
    server = kopf_settings.admission.server
    assert isinstance(server, ReviewServer)
    assert server.connection_life == 7.0
    assert (server.limits.peer_connections, server.limits.handshakes) == (9, 2)
    server.refused("peer_connections")
    assert told == ["peer_connections"]
