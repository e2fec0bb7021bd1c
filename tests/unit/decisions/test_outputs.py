"""One output seam (decisions.outputs, issue 35 item 5): what an admitted set becomes on its VMI and its launcher.

The webhooks take an `Output`; the device plugin's is the one today. A second output plugs in beside it: here one
that only labels what it touches stands in for it, and the pod webhook's judgement and flow are untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cozygpu.api import kinds
from cozygpu.decisions.admission import Member
from cozygpu.decisions.outputs import DEVICE_PLUGIN, Entries
from cozygpu.runtime.admission.pod_webhook import LauncherAdmission
from cozygpu.runtime.view import View
from tests.support.views import A10, cluster, device, gpu_class, node

CONTROLLER = "system:serviceaccount:kubevirt:kubevirt-controller"


class Labelled:
    """A stand-in second output: it marks what it was given, so a test sees the seam was used."""

    def entries(self, members: Sequence[Member]) -> Entries:
        return [{"claim": m.device.name} for m in members]

    def foreign(self, vmi: dict[str, Any], entries: Entries, managed: set[str]) -> list[str]:
        return []

    def admitted(self, vmi: dict[str, Any], entries: Entries, node: str | None) -> dict[str, Any]:
        return {**vmi, "claims": entries, "node": node}

    def launcher(self, pod: dict[str, Any], node: str) -> dict[str, Any]:
        return {**pod, "metadata": {**pod["metadata"], "labels": {"placed-on": node}}}


def _launcher(vmi_uid: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "virt-launcher-vm-abc",
            "namespace": "t1",
            "labels": {"kubevirt.io": "virt-launcher"},
            "ownerReferences": [
                {
                    "kind": "VirtualMachineInstance",
                    "name": "vm",
                    "uid": vmi_uid,
                    "controller": True,
                    "apiVersion": "kubevirt.io/v1",
                }
            ],
        },
        "spec": {"containers": [{"name": "compute", "resources": {"limits": {A10: "1"}, "requests": {A10: "1"}}}]},
    }


def _set_on_n1() -> View:
    attached = {"phase": "Bound", "nodeName": "n1", "attachedTo": {"vmi": "vm", "uid": "vmi-uid"}}
    c = cluster(classes=[gpu_class("a10")], nodes=[node("n1", {A10: 1})], devices=[device("held", status=attached)])
    view = View(c)
    view.apply(
        kinds.VMI,
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "metadata": {
                "name": "vm",
                "namespace": "t1",
                "uid": "vmi-uid",
                "resourceVersion": "1",
                "labels": {"gpu.cozystack.io/device-reference": "true"},
                "annotations": {"gpu.cozystack.io/devices": '[{"device": "held"}]'},
            },
        },
    )
    return view


def test_the_pod_webhook_puts_the_node_on_the_launcher_through_its_output() -> None:
    """The same judgement, the node given to whichever output the webhook was handed: the device plugin pins the
    pod; another output does its own thing with the same node."""
    view = _set_on_n1()
    pod = _launcher("vmi-uid")
    pinned = LauncherAdmission(view.cluster, CONTROLLER).admit(pod, CONTROLLER)
    assert pinned == DEVICE_PLUGIN.launcher(pod, "n1") and pinned != pod
    other = LauncherAdmission(view.cluster, CONTROLLER, output=Labelled()).admit(pod, CONTROLLER)
    assert other["metadata"]["labels"] == {"placed-on": "n1"} and other["spec"] == pod["spec"]


def test_the_device_plugins_launcher_pin_is_made_once() -> None:
    """A launcher already pinned to the node passes unchanged (a reinvocation)."""
    once = DEVICE_PLUGIN.launcher(_launcher("u"), "n1")
    assert DEVICE_PLUGIN.launcher(once, "n1") is once
