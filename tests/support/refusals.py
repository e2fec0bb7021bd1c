"""What a refused VMI admission says, and what it may not leave behind (§3)."""

from __future__ import annotations

from typing import Any

import pytest

from cozygpu.api import kinds
from cozygpu.api.names import LABEL_TEMPLATE_DEVICE
from cozygpu.devcluster.bodies import vmi_body
from cozygpu.kube.adapter import ApiError, Kube
from tests.support.bodies import unique


def leftovers(kube: Kube, namespace: str, vmi: str) -> list[str]:
    """What a refused admission of `vmi` may not leave behind: attachments, requests, template devices."""
    found = []
    for d in kube.list(kinds.GPU_DEVICE, namespace):
        name, status = d["metadata"]["name"], d.get("status", {})
        if (status.get("attachedTo") or {}).get("vmi") == vmi:
            found.append(f"{name}: attached")
        if (status.get("bindRequest") or {}).get("vmi") == vmi:
            found.append(f"{name}: bind request")
        if name.startswith(f"{vmi}-gpu-") and d["metadata"].get("labels", {}).get(LABEL_TEMPLATE_DEVICE) == "true":
            found.append(f"{name}: template device")
    return found


def refused(kube: Kube, body: dict[str, Any]) -> str:
    """Create the VMI, expecting our webhook's denial; return its message. No VMI is stored."""
    with pytest.raises(ApiError) as raised:
        kube.create(kinds.VMI, body)
    assert raised.value.status == 403, raised.value.message
    assert 'admission webhook "vmi.gpu.cozystack.io" denied the request' in raised.value.message
    assert kube.get_or_none(kinds.VMI, body["metadata"]["name"], body["metadata"]["namespace"]) is None
    return raised.value.message


def dry_denial(kube: Kube, namespace: str, refs: list[dict[str, Any]]) -> str:
    """The denial a dry run gets now, or "" when it would be admitted; for waiting on the operator's view."""
    try:
        kube.create(kinds.VMI, vmi_body(unique("probe"), namespace, refs), dry_run=True)
    except ApiError as e:
        return e.message
    return ""
