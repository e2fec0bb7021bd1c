"""Objects as tenants write them, for the demo, the benchmarks and the tests.

One builder per shape, so the demo (hack/demo.py), `bench/` and `tests/` send the API
server the same VMI a tenant would.
"""

from __future__ import annotations

import json
from typing import Any

from cozygpu.api.names import ANNOTATION_DEVICES, LABEL_DEVICE_REFERENCE

Body = dict[str, Any]


def vmi_body(
    name: str,
    namespace: str,
    refs: list[dict[str, Any]] | str | None,
    *,
    labels: dict[str, str] | None = None,
    domain: dict[str, Any] | None = None,
    affinity: dict[str, Any] | None = None,
) -> Body:
    """A VMI with device references in KubeVirt's schema; refs None leaves the annotation out, a string is
    written as it is (for malformed annotations)."""
    annotations = {}
    if refs is not None:
        annotations[ANNOTATION_DEVICES] = refs if isinstance(refs, str) else json.dumps(refs)
    spec: dict[str, Any] = {
        "domain": domain or {"devices": {}, "resources": {"requests": {"memory": "1Gi"}}},
    }
    if affinity:
        spec["affinity"] = affinity
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {LABEL_DEVICE_REFERENCE: "true", **(labels or {})},
            "annotations": annotations,
        },
        "spec": spec,
    }
