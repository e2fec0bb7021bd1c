"""Facts about one GPUDevice (§1.2, §4), each spelled once on the model: template-ness, its VMI owner, its open
request."""

from __future__ import annotations

from typing import Any

from cozygpu.api import GPUDevice
from cozygpu.api.names import LABEL_TEMPLATE_DEVICE
from tests.support.views import EPOCH, device, request


def labelled(value: str | None) -> GPUDevice:
    body = device("d")
    if value is not None:
        body["metadata"]["labels"] = {LABEL_TEMPLATE_DEVICE: value}
    return GPUDevice.from_wire(body)


def owned(*kinds: str) -> GPUDevice:
    body = device("vm-gpu-0", template=True)
    body["metadata"]["ownerReferences"] = [
        {"apiVersion": "kubevirt.io/v1", "kind": k, "name": f"{k.lower()}-x", "uid": f"uid-{k}"} for k in kinds
    ]
    return GPUDevice.from_wire(body)


def asked(result: str | None) -> GPUDevice:
    return GPUDevice.from_wire(device("d", status=request("r1", "vm", ["d"], EPOCH, result)))


def test_only_the_template_label_set_to_true_makes_a_template_device() -> None:
    """§1.2: "true" marks a template device; any other value, or none, is a held device."""
    assert labelled("true").is_template
    assert not labelled("false").is_template
    assert not labelled(None).is_template


def test_the_template_label_with_any_value_is_the_operators_to_set() -> None:
    """§9.1: the admission gate sees the label itself, whatever its value."""
    assert labelled("true").carries_template_label
    assert labelled("false").carries_template_label
    assert not labelled(None).carries_template_label


def test_the_vmi_owner_is_the_owner_reference_of_kind_vmi() -> None:
    """§6.1: a VirtualMachine or any other owner is not the VMI a template device belongs to."""
    owner = owned("VirtualMachine", "VirtualMachineInstance").vmi_owner
    assert owner is not None and owner.uid == "uid-VirtualMachineInstance"
    assert owned("VirtualMachine").vmi_owner is None
    assert owned().vmi_owner is None


def test_a_request_is_open_until_the_binder_writes_a_result() -> None:
    """§4: an empty result is open; Succeeded and Failed are answers; no request is no open request."""
    waiting = asked(None)
    assert waiting.open_request is not None and waiting.open_request.id == "r1" and waiting.open_request.open
    for result in ("Succeeded", "Failed"):
        answered = asked(result)
        assert answered.open_request is None
        assert answered.status.bind_request is not None and not answered.status.bind_request.open
    assert GPUDevice.from_wire(device("d")).open_request is None


def test_a_new_template_device_is_an_order_and_a_new_held_device_is_use() -> None:
    """§7.2: before the binder sees them, a held device counts against budgets and a template device does not."""
    assert GPUDevice.from_wire(device("d")).in_use
    assert not GPUDevice.from_wire(device("vm-gpu-0", template=True)).in_use


def pending(**status: Any) -> GPUDevice:
    return GPUDevice.from_wire(device("d", status={"phase": "Pending", **status}))


def test_only_an_open_request_keeps_a_pending_device_from_being_placed_alone() -> None:
    """§5.5: a device in an open request is answered as a set; once answered (even Failed) it waits on its own."""
    assert pending().awaits_node
    assert not pending(**request("r1", "vm", ["d"], EPOCH)).awaits_node
    assert pending(**request("r1", "vm", ["d"], EPOCH, "Failed")).awaits_node


def test_a_template_device_not_handed_over_waits_for_no_node() -> None:
    """§5.5: a fresh template device is its admission's to hand over; a fresh held device waits for a node."""
    assert not GPUDevice.from_wire(device("vm-gpu-0", template=True)).awaits_node
    assert GPUDevice.from_wire(device("d")).awaits_node
