"""The chart's webhook configurations, generated from the ones the operator registers itself.

`make chart-files` writes `chart_file()` to charts/cozy-gpu-operator/files/webhooks.json (a unit
test fails on drift); the chart's templates/webhooks.yaml renders it through `tpl` and adds each
hook's clientConfig (its Service and CA), so every rule, selector, condition and timeout comes from
`webhooks.configurations` and, through it, from the one table of hooks (api.hooks).
"""

from __future__ import annotations

import json
from typing import Any

from cozygpu.runtime.admission import webhooks

CHART_FILE = "webhooks.json"
_URL = "https://chart"
_TIMEOUT = 9999  # no timeout anyone sets: where it shows, it is the chart's value
_USER = "@@operator-username@@"
# Go templates, which `tpl` renders with the chart's values: raw strings (backquotes) keep the JSON valid.
_TEMPLATES = {
    f'"timeoutSeconds": {_TIMEOUT}': '"timeoutSeconds": {{ int .Values.operator.webhookTimeout }}',
    f'"timeoutSeconds": {webhooks.SHORT_TIMEOUT}': '"timeoutSeconds": {{ min (int .Values.operator.webhookTimeout) '
    f"{webhooks.SHORT_TIMEOUT} }}}}",
    _USER: "{{ include `cozygpu.username` . }}",
}


def _without_client(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The configuration's webhooks, each with the hook's id in place of its clientConfig (the chart's to add)."""
    out = []
    for webhook in config["webhooks"]:
        rest = {k: v for k, v in webhook.items() if k != "clientConfig"}
        out.append({"hook": webhook["clientConfig"]["url"].removeprefix(f"{_URL}/"), **rest})
    return out


def chart_file() -> str:
    mutating, validating = webhooks.configurations(_URL, b"", _TIMEOUT, _USER)
    # Each configuration's name is the chart's Service name after this prefix (the order, webhooks.MUTATING_PREFIX).
    prefix = {"mutating": webhooks.MUTATING_PREFIX, "validating": ""}
    text = json.dumps(
        {"prefix": prefix, "mutating": _without_client(mutating), "validating": _without_client(validating)},
        indent=2,
    )
    for sentinel, template in _TEMPLATES.items():
        text = text.replace(sentinel, template)
    return text + "\n"
