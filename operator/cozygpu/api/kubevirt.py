"""What the operator reads of KubeVirt's own CR (§1.5): the host devices it permits.

Callers: `state.cluster` keeps the result per KubeVirt CR; `decisions.admission` refuses a
class whose resource KubeVirt would not hand to a VM.
"""

from __future__ import annotations

from typing import Any


def permitted_resources(body: dict[str, Any]) -> set[str] | None:
    """The resource names of `spec.configuration.permittedHostDevices`; None when no table is set, since
    KubeVirt's pod renderer restricts host devices only when it is set at all."""
    permitted = ((body.get("spec") or {}).get("configuration") or {}).get("permittedHostDevices")
    if not isinstance(permitted, dict):
        return None
    return {
        d["resourceName"]
        for key in ("pciHostDevices", "mediatedDevices")
        for d in permitted.get(key) or []
        if isinstance(d, dict) and d.get("resourceName")
    }
