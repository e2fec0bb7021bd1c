"""The API models of §1: wire names, defaults, derived values."""

from __future__ import annotations

import datetime as dt
import sys

import pytest
from pydantic import ValidationError

from cozygpu.api import (
    BindResult,
    GPUBudget,
    GPUClass,
    GPUDevice,
    GPUMode,
    Phase,
    meta,
    names,
)
from tests.support.views import device


def test_template_device_name_is_predictable_from_vmi_and_entry() -> None:
    """§1.5: entry i of VMI v produces the device v-gpu-<i>."""
    assert names.template_device_name("train", 0) == "train-gpu-0"
    assert names.template_device_name("train", 12) == "train-gpu-12"


def test_gpu_entry_name_carries_entry_and_unit() -> None:
    """§1.5: the gpus entry for unit j of entry i is gpudev<i>-<j>."""
    assert names.gpu_entry_name(0, 0) == "gpudev0-0"
    assert names.gpu_entry_name(3, 1) == "gpudev3-1"


def test_wire_names_live_in_the_api_group() -> None:
    """§1.5: every label, annotation and finalizer is in gpu.cozystack.io."""
    for value in (
        names.LABEL_DEVICE_REFERENCE,
        names.LABEL_MODE,
        names.ANNOTATION_DEVICES,
        names.LABEL_TEMPLATE_DEVICE,
        names.FINALIZER_IN_USE,
    ):
        assert value.startswith("gpu.cozystack.io/")
    assert names.API_VERSION == "gpu.cozystack.io/v1alpha1"


@pytest.mark.parametrize(
    ("mode", "max_count", "effective"),
    [
        ("vgpu", None, 1),
        ("passthrough", None, None),
        ("vgpu", 4, 4),
        ("passthrough", 2, 2),
    ],
)
def test_effective_max_count(mode: str, max_count: int | None, effective: int | None) -> None:
    """§1.1: maxCount when set; else 1 for vgpu and no limit for passthrough."""
    spec: dict[str, object] = {"mode": mode, "resourceName": "nvidia.com/X"}
    if max_count is not None:
        spec["maxCount"] = max_count
    cls = GPUClass.from_wire({"metadata": {"name": "c"}, "spec": spec})
    assert cls.effective_max_count() == effective


def test_device_reads_what_the_api_server_returns() -> None:
    """A stored GPUDevice (camelCase, extra fields) parses into the model."""
    body = {
        "apiVersion": "gpu.cozystack.io/v1alpha1",
        "kind": "GPUDevice",
        "metadata": {
            "name": "d",
            "namespace": "ns",
            "uid": "u-1",
            "resourceVersion": "42",
            "creationTimestamp": "2026-01-02T03:04:05Z",
            "managedFields": [{"manager": "x"}],
        },
        "spec": {"className": "a10", "count": 2},
        "status": {
            "phase": "Bound",
            "nodeName": "n1",
            "attachedTo": {"vmi": "vm", "since": "2026-01-02T03:04:06Z"},
            "bindRequest": {
                "id": "r",
                "vmi": "vm",
                "devices": ["d"],
                "requestedAt": "2026-01-02T03:04:06Z",
                "result": "Succeeded",
            },
        },
    }
    device = GPUDevice.from_wire(body)
    assert device.spec.class_name == "a10"
    assert device.status.phase is Phase.BOUND
    assert device.status.bind_request is not None
    assert device.status.bind_request.result is BindResult.SUCCEEDED
    assert device.status.attached_to is not None
    assert device.status.attached_to.since == dt.datetime(2026, 1, 2, 3, 4, 6, tzinfo=dt.UTC)
    assert device.holds_gpus
    assert device.counts_against_budgets


def test_wire_round_trip_uses_api_names_and_rfc3339() -> None:
    """wire() writes camelCase keys, Z-suffixed times and leaves unset fields out."""
    device = GPUDevice.from_wire(
        {
            "metadata": {"name": "d", "namespace": "ns"},
            "spec": {"className": "a10", "count": 1},
            "status": {"attachedTo": {"vmi": "vm", "since": "2026-01-02T03:04:06+00:00"}},
        }
    )
    wire = device.wire()
    assert wire["spec"] == {"className": "a10", "count": 1}
    assert wire["status"]["attachedTo"] == {"vmi": "vm", "since": "2026-01-02T03:04:06Z"}
    assert "phase" not in wire["status"]
    assert "bindRequest" not in wire["status"]


@pytest.mark.parametrize(
    ("phase", "holds", "counts"),
    [(None, False, False), ("Pending", False, True), ("Bound", True, True), ("Lost", False, True)],
)
def test_which_phases_hold_gpus_and_count_against_budgets(phase: str | None, holds: bool, counts: bool) -> None:
    """§1.2/§7.2: only Bound holds GPUs; Pending, Bound and Lost count against budgets."""
    status = {"phase": phase} if phase else {}
    device = GPUDevice.from_wire({"metadata": {"name": "d"}, "spec": {"className": "c", "count": 1}, "status": status})
    assert device.holds_gpus is holds
    assert device.counts_against_budgets is counts


def test_device_count_below_one_is_refused_by_the_model() -> None:
    """§1.2: count >= 1, also for objects the operator builds itself."""
    with pytest.raises(ValidationError, match="count"):
        GPUDevice.from_wire({"metadata": {"name": "d"}, "spec": {"className": "c", "count": 0}})


def test_class_mode_is_an_enum() -> None:
    """§1.1: mode is passthrough or vgpu, nothing else."""
    assert {m.value for m in GPUMode} == {"passthrough", "vgpu"}
    with pytest.raises(ValidationError, match="mode"):
        GPUClass.from_wire({"metadata": {"name": "c"}, "spec": {"mode": "mig", "resourceName": "x/y"}})


def test_budget_limits_are_non_negative() -> None:
    """§9.3: limits are non-negative integers."""
    GPUBudget.from_wire({"metadata": {"name": "b"}, "spec": {"limits": {"a10": 0}, "total": 3}})
    with pytest.raises(ValidationError, match="limits"):
        GPUBudget.from_wire({"metadata": {"name": "b"}, "spec": {"limits": {"a10": -1}}})


def test_objects_read_from_the_wire_are_compact_and_copy_like_any_other() -> None:
    """§13.3: a device read from the wire shares one untracked field set and interned strings; a copy with
    changes is still a separate object, the original unchanged, and both serialise as before."""
    body = device("a", phase="Bound", node_name="n1")
    d = GPUDevice.from_wire(body)
    assert d.status.__pydantic_fields_set__ is meta._UNTRACKED and d.metadata.__pydantic_fields_set__ is meta._UNTRACKED
    assert d.status.node_name is sys.intern("n1")
    moved = d.model_copy(update={"status": d.status.model_copy(update={"node_name": "n2"})})
    assert (moved.status.node_name, d.status.node_name) == ("n2", "n1")
    assert GPUDevice.model_validate(body).wire() == d.wire()
