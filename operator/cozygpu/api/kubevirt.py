"""What the operator reads of KubeVirt's objects: the host devices its CR permits (§1.5), and whether a
VirtualMachine wants to run (§6.6).

Callers: the view (`state.indexers`) keeps the permitted resources per KubeVirt CR; `decisions.admission` refuses a
class whose resource KubeVirt would not hand to a VM; the collector asks `wants_to_run` of the VM
whose VMI is gone, read fresh; `decisions.admission` and `decisions.lifecycle` make a template device's owner
(`owned_by`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cozygpu.api.meta import OwnerReference
from cozygpu.api.names import KUBEVIRT_API_VERSION

EXTERNAL = "External"  # the eviction strategy that leaves a VMI's evacuation to an outside controller (§6.8)


@dataclass(frozen=True)
class KubeVirtConfig:
    """What the view keeps of a KubeVirt CR: the permitted host devices' resource names (None: no table set,
    §1.5), and the cluster-wide eviction strategy a VMI without its own follows (None: none, §6.8)."""

    permitted: frozenset[str] | None = None
    eviction_strategy: str | None = None


def owned_by(kind: str, name: str, uid: str) -> OwnerReference:
    """A template device's owner: the VirtualMachine controlling its VMI, or the VMI when none does (§6.1, §6.6)."""
    return OwnerReference(api_version=KUBEVIRT_API_VERSION, kind=kind, name=name, uid=uid)


def kubevirt_config(body: dict[str, Any]) -> KubeVirtConfig:
    permitted = permitted_resources(body)
    strategy = ((body.get("spec") or {}).get("configuration") or {}).get("evictionStrategy")
    return KubeVirtConfig(
        frozenset(permitted) if permitted is not None else None, strategy if isinstance(strategy, str) else None
    )


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


def wants_to_run(vm: dict[str, Any] | None) -> bool:
    """§6.6: whether KubeVirt will make the VM a new VMI: not being deleted, a run strategy that restarts
    (`Always`, `RerunOnFailure`; `Manual` only on a Start request) or `running: true`, and no Stop as the last
    state change request (`virtctl stop` on a Manual VM; a restart asks Stop, then Start)."""
    if vm is None or (vm.get("metadata") or {}).get("deletionTimestamp"):
        return False
    spec, status = vm.get("spec") or {}, vm.get("status") or {}
    requests = [r.get("action") for r in status.get("stateChangeRequests") or [] if isinstance(r, dict)]
    last = requests[-1] if requests else None
    strategy = spec.get("runStrategy") or ("Always" if spec.get("running") else "Halted")
    if strategy in ("Always", "RerunOnFailure"):
        return last != "Stop"
    return strategy == "Manual" and last == "Start"
