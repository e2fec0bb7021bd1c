"""The VMI webhook's undo (§4, §6.3) on the one writer's outcomes, against the in-memory API.

A refused admission takes back exactly what it wrote; where someone wrote meanwhile, it decides
again on the writer's one fresh read (a CONFLICT's body), not on a read of its own (issue 20 item 4).
No binder runs here, so every admission is refused when the bind times out.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cozygpu.api import kinds
from cozygpu.runtime.admission.outcomes import Refusal
from cozygpu.runtime.admission.reservations import Reservations
from cozygpu.runtime.admission.vmi_webhook import VMIAdmission
from cozygpu.runtime.admission.waiters import Waiters
from tests.support.bodies import vmi_body
from tests.support.memkube import MemKube
from tests.support.views import A10, gpu_class, node
from tests.support.writing import NS, device, writer

Body = dict[str, Any]


def _admission() -> tuple[VMIAdmission, MemKube]:
    w, view, kube = writer()
    view.apply(kinds.NODE, node("n1", {A10: 8}))
    view.apply(kinds.GPU_CLASS, kube.put(kinds.GPU_CLASS, gpu_class("a10")))
    admission = VMIAdmission(view.cluster, Waiters(), Reservations(ttl=30), bind_timeout=0.1, max_devices=8, writer=w)
    return admission, kube


def _vmi(*refs: Body) -> Body:
    return vmi_body("v", NS, list(refs))


TEMPLATE = {"deviceTemplate": {"className": "a10", "count": 1}}


def _bound(kube: MemKube, name: str) -> None:
    """A held device Bound on n1, as the binder leaves one (§5)."""
    body = kube.put(kinds.GPU_DEVICE, device(name))
    kube.change(kinds.GPU_DEVICE, {**body, "status": {"phase": "Bound", "nodeName": "n1"}}, status=True)


def _reads(kube: MemKube, name: str) -> int:
    return sum(1 for call in kube.calls if call == ("get", "GPUDevice", name))


def test_a_refused_admission_deletes_the_template_device_it_created() -> None:
    """§4: the binder never answered: the device this call created is deleted again."""
    admission, kube = _admission()
    with pytest.raises(Refusal, match="did not answer"):
        asyncio.run(admission.admit(_vmi(TEMPLATE), dry_run=False))
    assert kube.stored(kinds.GPU_DEVICE, "v-gpu-0", NS) is None


def test_a_refused_admission_of_a_vms_vmi_deletes_its_template_device_finalizer_and_all() -> None:
    """A VM's template device is made with the in-use finalizer (issue 37 item 8): the undo deletes it and then
    takes the finalizer off, so nothing of the refused start stays behind."""
    admission, kube = _admission()
    vmi = _vmi(TEMPLATE)
    vm = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": "v", "uid": "u-vm", "controller": True}
    vmi["metadata"]["ownerReferences"] = [vm]
    with pytest.raises(Refusal, match="did not answer"):
        asyncio.run(admission.admit(vmi, dry_run=False))
    assert [c for c in kube.calls if c[0] == "create"] == [("create", "GPUDevice", "v-gpu-0")]
    assert kube.count("delete") == 1 and kube.count("patch") == 1  # the delete held by the finalizer, then it off
    assert kube.stored(kinds.GPU_DEVICE, "v-gpu-0", NS) is None


def test_a_refused_admission_clears_its_request_and_attachment_from_a_held_device() -> None:
    """§4: a held device keeps existing; this call's attachment and request are taken back."""
    admission, kube = _admission()
    _bound(kube, "h")
    with pytest.raises(Refusal):
        asyncio.run(admission.admit(_vmi({"device": "h"}), dry_run=False))
    held = kube.stored(kinds.GPU_DEVICE, "h", NS)
    assert held is not None and held["status"]["phase"] == "Bound"
    assert "attachedTo" not in held["status"] and "bindRequest" not in held["status"]
    assert kube.count("replace_status") == 2  # the request written, then taken back


def test_an_undo_whose_delete_loses_to_a_takeover_leaves_the_device_on_the_writers_read() -> None:
    """Another create of the name takes the device over while the undo deletes it: the delete's precondition
    fails, the writer's fresh read shows the takeover, and the undo leaves the device without reading again."""
    admission, kube = _admission()

    def take_over() -> None:
        current = kube.stored(kinds.GPU_DEVICE, "v-gpu-0", NS)
        assert current is not None
        request = {"id": "another-call", "vmi": "v", "devices": ["v-gpu-0"], "requestedAt": "2026-01-01T00:00:00Z"}
        kube.change(kinds.GPU_DEVICE, {**current, "status": {**current["status"], "bindRequest": request}}, status=True)

    kube.before_next("delete", take_over)
    with pytest.raises(Refusal):
        asyncio.run(admission.admit(_vmi(TEMPLATE), dry_run=False))
    left = kube.stored(kinds.GPU_DEVICE, "v-gpu-0", NS)
    assert left is not None and left["status"]["bindRequest"]["id"] == "another-call"
    # One read to resolve the reference, one before the delete, one by the writer after its conflict.
    assert _reads(kube, "v-gpu-0") == 3 and kube.count("delete") == 1


def test_an_undo_whose_clear_loses_a_race_clears_the_winners_version() -> None:
    """Someone writes the held device while the undo clears it: the clear is a CONFLICT and is written again
    on the writer's read, keeping their change."""
    admission, kube = _admission()
    _bound(kube, "h")

    def someone_writes() -> None:
        current = kube.stored(kinds.GPU_DEVICE, "h", NS)
        assert current is not None
        kube.change(kinds.GPU_DEVICE, {**current, "metadata": {**current["metadata"], "labels": {"team": "a"}}})

    def arm() -> None:  # the first status write is the request; the race hits the undo's clear
        kube.before_next("replace_status", someone_writes)

    kube.before_next("replace_status", arm)
    with pytest.raises(Refusal):
        asyncio.run(admission.admit(_vmi({"device": "h"}), dry_run=False))
    held = kube.stored(kinds.GPU_DEVICE, "h", NS)
    assert held is not None and held["metadata"]["labels"] == {"team": "a"}
    assert "attachedTo" not in held["status"] and "bindRequest" not in held["status"]
    assert _reads(kube, "h") == 3  # resolve, the undo's read, the writer's read after the conflict
