"""How a set placed on a node reaches its guest (§3.7, §3.8, §12.2): one seam, the device-plugin output today.

Admission decides the set and its node whatever the guest gets; an `Output` says what that becomes on the VMI and
on its launcher pod. `DevicePlugin` is KubeVirt's device-plugin path: one `gpus` entry per unit naming the class's
resource, the VMI pinned to the node (informative: KubeVirt's VM controller may rewrite it, §3), and the launcher
pod pinned (the pin that holds, §12.2). A second output (DRA: ResourceClaims in place of device-plugin entries, as
KubeVirt 1.9 admits GPUs) implements `Output` and is handed to the webhooks where the Operator wires them; the VMI
webhook's flow, the binder and the pod webhook's judgement (`decisions.launchers`) do not change.

Callers: the VMI webhook (entries, foreign entries, the VMI as admitted) and the pod webhook (the launcher as
admitted), both in runtime.admission; an import-linter contract keeps them from the device plugin's own rules.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, Protocol

from cozygpu.api.names import gpu_entry_name
from cozygpu.decisions.admission import Member
from cozygpu.decisions.pinning import is_pinned, pinned_spec

Entries = list[dict[str, Any]]


class Output(Protocol):
    def entries(self, members: Sequence[Member]) -> Entries:
        """What the set puts on the VMI, in entry order (named so a reinvocation finds its own)."""
        ...

    def foreign(self, vmi: dict[str, Any], entries: Entries, managed: set[str]) -> list[str]:
        """§3.8: what the VMI carries that gives it managed GPUs besides `entries` (`managed`: every class's
        resource and KubeVirt's permitted ones), each named for the refusal."""
        ...

    def admitted(self, vmi: dict[str, Any], entries: Entries, node: str | None) -> dict[str, Any]:
        """The VMI as admitted: its entries in place, and pinned to `node` once there is one."""
        ...

    def launcher(self, pod: dict[str, Any], node: str) -> dict[str, Any]:
        """A launcher pod of the VMI as admitted: bound to the set's node (unchanged if it is already)."""
        ...


def _dig(body: dict[str, Any], *path: str) -> Any:
    node: Any = body
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node


class DevicePlugin:
    """KubeVirt's device-plugin path: `spec.domain.devices.gpus` entries naming the class's resource."""

    def entries(self, members: Sequence[Member]) -> Entries:
        """One `gpus` entry per unit, named after the entry index so a reinvocation finds its own."""
        return [
            {"name": gpu_entry_name(m.index, j), "deviceName": m.cls.spec.resource_name}
            for m in members
            for j in range(m.device.spec.count)
        ]

    def foreign(self, vmi: dict[str, Any], entries: Entries, managed: set[str]) -> list[str]:
        ours = {e["name"]: e["deviceName"] for e in entries}
        out = []
        gpus, host_devices = (_dig(vmi, "spec", "domain", "devices", f) for f in ("gpus", "hostDevices"))
        # What the API server would reject anyway is named as such, never iterated as if it were a list.
        for field, value in (("gpus", gpus), ("hostDevices", host_devices)):
            if value is not None and not isinstance(value, list):
                out.append(f"{field} (not a list)")
        for i, entry in enumerate(gpus if isinstance(gpus, list) else []):
            if not isinstance(entry, dict):
                out.append(f"gpus entry {i} (not an object)")
                continue
            name = entry.get("name", "")
            if not (name in ours and entry.get("deviceName") == ours[name]):
                out.append(f"gpus {name}")
        for entry in host_devices if isinstance(host_devices, list) else []:
            if isinstance(entry, dict) and entry.get("deviceName") in managed:
                out.append(f"hostDevices {entry.get('name', '')}")
        for kind in ("requests", "limits"):
            resources = _dig(vmi, "spec", "domain", "resources", kind)
            if isinstance(resources, dict):
                out += [f"resources.{kind} {k}" for k in sorted(resources) if k in managed]
        return out

    def admitted(self, vmi: dict[str, Any], entries: Entries, node: str | None) -> dict[str, Any]:
        out = copy.deepcopy(vmi)
        spec = out.setdefault("spec", {})
        devices = spec.setdefault("domain", {}).setdefault("devices", {})
        devices["gpus"] = [dict(e) for e in entries]
        if node is not None:
            out["spec"] = pinned_spec(spec, node)
        return out

    def launcher(self, pod: dict[str, Any], node: str) -> dict[str, Any]:
        spec = pod.get("spec") or {}
        if is_pinned(spec, node):
            return pod
        return {**pod, "spec": pinned_spec(spec, node)}


DEVICE_PLUGIN: Output = DevicePlugin()
