"""The VMI webhook's fresh reads (§3.3, §3.4, §14.2) in one round (issue 22 item 4): the VMI's name and every
referenced device are asked for at once, so an admission waits for one API answer where it waited for two;
the rules are still judged in their order, on what the API said, against the in-memory API."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cozygpu.api import kinds
from cozygpu.api.kinds import Kind
from cozygpu.kube.adapter import ApiError
from cozygpu.runtime.admission.outcomes import InternalError, Refusal
from cozygpu.runtime.admission.reservations import Reservations
from cozygpu.runtime.admission.vmi_webhook import VMIAdmission
from cozygpu.runtime.admission.waiters import Waiters
from tests.support.bodies import vmi_body
from tests.support.memkube import MemKube
from tests.support.views import A10, gpu_class, node
from tests.support.writing import NS, device, writer

Body = dict[str, Any]
TEMPLATE = {"deviceTemplate": {"className": "a10", "count": 1}}
WRITES = ("create", "replace", "replace_status", "patch", "delete")


class SlowReads:
    """Every read takes a moment, as a real round trip does; counts how many are in flight at once and fails
    the reads of the kinds it is told to."""

    def __init__(self, kube: MemKube, failing: tuple[str, ...] = ()) -> None:
        self.most = 0
        self._running = 0
        self._read = kube.get_or_none
        self._failing = failing

    async def __call__(self, kind: Kind, name: str, namespace: str | None = None) -> Body | None:
        self._running += 1
        self.most = max(self.most, self._running)
        try:
            await asyncio.sleep(0.01)
            if kind.kind in self._failing:
                raise ApiError(500, "InternalError", f"{kind.kind} {name}: the API server is unwell")
            return await self._read(kind, name, namespace)
        finally:
            self._running -= 1


def _admission(failing: tuple[str, ...] = ()) -> tuple[VMIAdmission, MemKube, SlowReads]:
    w, view, kube = writer()
    view.apply(kinds.NODE, node("n1", {A10: 8}))
    view.apply(kinds.GPU_CLASS, kube.put(kinds.GPU_CLASS, gpu_class("a10")))
    held = kube.put(kinds.GPU_DEVICE, device("h"))
    kube.change(kinds.GPU_DEVICE, {**held, "status": {"phase": "Bound", "nodeName": "n1"}}, status=True)
    slow = SlowReads(kube, failing)
    kube.get_or_none = slow  # type: ignore[method-assign]
    admission = VMIAdmission(view.cluster, Waiters(), Reservations(ttl=30), bind_timeout=0.1, max_devices=8, writer=w)
    return admission, kube, slow


def _vmi(*refs: Body) -> Body:
    return vmi_body("v", NS, list(refs))


def _running_vmi(kube: MemKube) -> None:
    kube.put(kinds.VMI, {**_vmi(), "metadata": {"name": "v", "namespace": NS}})


def test_the_vmi_name_and_every_device_are_read_at_once() -> None:
    """A held and a template reference: the VMI's name and both devices are three reads in flight together."""
    admission, kube, slow = _admission()
    admitted = asyncio.run(admission.admit(_vmi({"device": "h"}, TEMPLATE), dry_run=True))
    assert admitted["spec"]["domain"]["devices"]["gpus"]
    reads = [(kind, name) for method, kind, name in kube.calls if method == "get"]
    assert sorted(reads) == [("GPUDevice", "h"), ("GPUDevice", "v-gpu-1"), ("VirtualMachineInstance", "v")]
    assert slow.most == 3


def test_a_vmi_of_the_name_is_refused_before_its_devices_are_judged() -> None:
    """§14.2 comes first: a create of a running VMI's name is refused as such, whatever its references say,
    and writes nothing, though its devices were read at the same time."""
    admission, kube, _ = _admission()
    _running_vmi(kube)
    with pytest.raises(Refusal, match="VMI v already exists") as refused:
        asyncio.run(admission.admit(_vmi({"device": "h"}, {"device": "missing"}), dry_run=False))
    assert "missing" not in str(refused.value)
    assert not [call for call in kube.calls if call[0] in WRITES]


def test_a_vmi_of_the_name_is_refused_even_when_reading_its_devices_failed() -> None:
    """The API failed the device reads but said the name is taken: that is the tenant's refusal (§14.2), not
    an error, and nothing is written."""
    admission, kube, _ = _admission(failing=("GPUDevice",))
    _running_vmi(kube)
    with pytest.raises(Refusal, match="VMI v already exists"):
        asyncio.run(admission.admit(_vmi({"device": "h"}, TEMPLATE), dry_run=False))
    assert not [call for call in kube.calls if call[0] in WRITES]


@pytest.mark.parametrize("failing", ["VirtualMachineInstance", "GPUDevice"])
def test_a_failed_read_fails_closed_and_writes_nothing(failing: str) -> None:
    """Whichever read the API failed, the admission is an error (§3: it fails closed), never admitted on the
    reads that did answer, and nothing is written."""
    admission, kube, _ = _admission(failing=(failing,))
    with pytest.raises(InternalError, match="the API server is unwell"):
        asyncio.run(admission.admit(_vmi({"device": "h"}, TEMPLATE), dry_run=False))
    assert not [call for call in kube.calls if call[0] in WRITES]


def test_a_template_class_created_a_moment_before_is_read_in_the_same_round_not_refused() -> None:
    """§9 (issue 33 item 5): a VMI's template names a class its view has not seen yet (one manifest applied at
    once); the class is read fresh beside the VMI's name and its devices, in one round, and the VMI admitted.
    Before, it was refused with "GPUClass acc-u does not exist"."""
    admission, kube, slow = _admission()
    kube.put(kinds.GPU_CLASS, gpu_class("acc-u"))  # in the API, not yet in the view
    fresh = {"deviceTemplate": {"className": "acc-u", "count": 1}}
    admitted = asyncio.run(admission.admit(_vmi({"device": "h"}, fresh), dry_run=True))
    assert admitted["spec"]["domain"]["devices"]["gpus"]
    reads = [(kind, name) for method, kind, name in kube.calls if method == "get"]
    assert ("GPUClass", "acc-u") in reads and slow.most == 4


def test_a_template_class_the_api_server_does_not_have_either_is_refused_naming_the_reference() -> None:
    """The fresh read finds no class: refused, naming the deviceTemplate and its class."""
    admission, _, _ = _admission()
    with pytest.raises(Refusal, match="deviceTemplate 0: GPUClass acc-x does not exist"):
        asyncio.run(admission.admit(_vmi({"deviceTemplate": {"className": "acc-x", "count": 1}}), dry_run=True))
