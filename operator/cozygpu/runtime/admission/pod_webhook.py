"""The pod admission executor (§12.2): launcher pods pinned to their VMI's set, other GPU pods refused.

Called by the mutating webhook handler (runtime.process.handlers) for CREATE of pods that the
webhook configuration lets through (launcher pods asking for an extended resource).
It decides from the view: every device the VMI webhook attached and every answer the
binder wrote went into the view when its write returned, so a pod rendered after its
VMI was admitted finds its set there.
"""

from __future__ import annotations

import time
from typing import Any

import structlog

from cozygpu.decisions import launchers
from cozygpu.decisions.outputs import DEVICE_PLUGIN, Output
from cozygpu.runtime.admission.outcomes import Refusal
from cozygpu.state.cluster import Cluster

log = structlog.get_logger("cozygpu.webhook")


class LauncherAdmission:
    def __init__(
        self,
        cluster: Cluster,
        controller_user: str,
        exempt: frozenset[str] = frozenset(),
        output: Output = DEVICE_PLUGIN,
    ) -> None:
        """`output`: what the set's node becomes on the launcher (decisions.outputs; the device plugin's pin)."""
        self._cluster = cluster
        self._output = output
        self._controller_user = controller_user
        self._exempt = exempt  # namespaces §12 does not guard, by name (the operator's settings)

    def admit(self, pod: dict[str, Any], user: str) -> dict[str, Any]:
        """The pod as admitted: untouched, or pinned to its set's node; raises Refusal."""
        started = time.monotonic()
        meta = pod.get("metadata") or {}
        namespace = meta.get("namespace") or ""
        owner = launchers.owner_vmi(pod)
        vmi = owner[0] if owner else None
        attached = self._cluster.vmis.set_of(namespace, *owner) if owner else []
        exempt = namespace in self._exempt
        previous = (
            [p.ident for p in self._cluster.pods.launchers_of(namespace, vmi) if p.vmi_uid != owner[1]]
            if (owner and vmi)
            else []
        )
        verdict = launchers.judge(
            pod, user, self._controller_user, attached, self._cluster.classes, exempt=exempt, previous=previous
        )
        fields = {"namespace": namespace, "pod": meta.get("name") or meta.get("generateName"), "vmi": vmi}
        if verdict.refusal is not None:
            log.info("pod.refused", reason=verdict.refusal, user=user, **fields)
            raise Refusal(verdict.refusal)
        if verdict.node is None:
            return pod
        ms = round((time.monotonic() - started) * 1000, 1)
        log.info("pod.pinned", node=verdict.node, duration_ms=ms, **fields)
        return self._output.launcher(pod, verdict.node)
