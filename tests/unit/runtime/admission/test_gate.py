"""The admission gate (runtime.admission.gate): one Refusal, whoever raises it, is a 403 the tenant reads; an
InternalError is a 500 that fails closed; each answer is counted by webhook and outcome (issue 35 item 3)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import kopf
import pytest

from cozygpu.runtime.admission import webhooks
from cozygpu.runtime.admission.gate import Gate
from cozygpu.runtime.admission.outcomes import InternalError, Refusal
from cozygpu.runtime.metrics import Metrics
from cozygpu.state.cluster import Cluster


class Raising:
    """Every executor's entry point, raising what it is given."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def admit_async(self, *_: Any, **__: Any) -> Any:
        raise self.error

    def raise_now(self, *_: Any, **__: Any) -> Any:
        raise self.error


def _gate(error: Exception) -> tuple[Gate, Metrics]:
    raising, metrics = Raising(error), Metrics(Cluster())

    class Vmis:
        admit = raising.admit_async

    class Launchers:
        admit = raising.raise_now

    class Validation:
        device = raising.admit_async
        gpu_class = raising.raise_now
        budget = raising.raise_now

    gate = Gate(cast(Any, Vmis()), cast(Any, Launchers()), cast(Any, Validation()), metrics, synced=lambda: True)
    return gate, metrics


def _calls(gate: Gate) -> dict[str, Any]:
    return {
        webhooks.VMI_HOOK: lambda: asyncio.run(gate.mutate_vmi({}, kopf.Patch(), False)),
        webhooks.POD_HOOK: lambda: gate.mutate_pod({}, kopf.Patch(), "someone"),
        webhooks.DEVICE_HOOK: lambda: asyncio.run(gate.validate_device("CREATE", {}, None, "someone", False)),
        webhooks.CLASS_HOOK: lambda: gate.validate_class("CREATE", {}, None),
        webhooks.BUDGET_HOOK: lambda: gate.validate_budget({}, []),
    }


def test_a_refusal_from_any_webhook_is_a_403_with_its_words() -> None:
    """The VMI, pod, device, class and budget webhooks raise the same Refusal; each is a 403 counted as denied."""
    gate, metrics = _gate(Refusal("GPUDevice d: no such class"))
    for hook, call in _calls(gate).items():
        with pytest.raises(kopf.AdmissionError) as answered:
            call()
        assert (answered.value.code, str(answered.value)) == (403, "GPUDevice d: no such class"), hook
        assert metrics.admission.labels(hook, "denied")._sum.get() > 0, hook  # type: ignore[attr-defined]


def test_an_internal_error_fails_closed_with_a_500() -> None:
    """The API failing the operator mid-check is an error, never a denial nor an allowed answer."""
    gate, metrics = _gate(InternalError("the API server is unwell"))
    with pytest.raises(kopf.AdmissionError) as answered:
        _calls(gate)[webhooks.VMI_HOOK]()
    assert answered.value.code == 500 and "could not check the VMI: the API server is unwell" in str(answered.value)
    assert metrics.admission.labels(webhooks.VMI_HOOK, "error")._sum.get() > 0  # type: ignore[attr-defined]
