"""The operator's log events are a contract with platform teams (docs/operating.md, "Logs"; issue 35 item 8): each
decision is one event, named as the docs name it, with the keys the docs promise. Captured as structlog emits them,
with the context every line of a review or a decision carries."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from cozygpu.api import kinds
from cozygpu.api.meta import now
from cozygpu.runtime.admission.reservations import Reservations
from cozygpu.runtime.admission.vmi_webhook import Refusal, VMIAdmission
from cozygpu.runtime.admission.waiters import Waiters
from cozygpu.runtime.workers.binder import Binder
from tests.support.bodies import vmi_body
from tests.support.views import A10, device, gpu_class, node, request
from tests.support.workers import run_until
from tests.support.writing import NS, writer
from tests.support.writing import seen_with_status as seen

Body = dict[str, Any]


@pytest.fixture
def events() -> Iterator[list[dict[str, Any]]]:
    """What is logged meanwhile, each event with the context bound around it (a review's namespace and VMI)."""
    with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars]) as captured:
        yield captured


def _named(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == name]


def _vmi(name: str, *refs: Body) -> Body:
    return vmi_body(name, NS, list(refs))


def _admission() -> VMIAdmission:
    w, view, kube = writer()
    view.apply(kinds.NODE, node("n1", {A10: 8}))
    view.apply(kinds.GPU_CLASS, kube.put(kinds.GPU_CLASS, gpu_class("a10")))
    return VMIAdmission(view.cluster, Waiters(), Reservations(ttl=30), bind_timeout=0.05, max_devices=8, writer=w)


def test_an_admission_logs_vmi_admitted_with_its_namespace_vmi_and_duration(events: list[dict[str, Any]]) -> None:
    """`vmi.admitted`: namespace, vmi, node, dry_run and duration_ms, at info."""
    asyncio.run(_admission().admit(_vmi("vm", {"deviceTemplate": {"className": "a10", "count": 1}}), dry_run=True))
    [admitted] = _named(events, "vmi.admitted")
    assert admitted["log_level"] == "info"
    assert {"namespace": NS, "vmi": "vm", "dry_run": True}.items() <= admitted.items()
    assert {"node", "duration_ms"} <= admitted.keys()


def test_a_refusal_logs_vmi_refused_with_the_reason_the_tenant_reads(events: list[dict[str, Any]]) -> None:
    """`vmi.refused`: namespace, vmi and the reason, which is the refusal's own text."""
    with pytest.raises(Refusal) as refused:
        asyncio.run(_admission().admit(_vmi("vm", {"device": "missing"}), dry_run=False))
    [logged] = _named(events, "vmi.refused")
    assert logged["log_level"] == "info"
    assert {"namespace": NS, "vmi": "vm", "reason": str(refused.value)}.items() <= logged.items()
    assert "duration_ms" in logged


def test_an_answer_logs_bind_answered_and_a_waiting_device_logs_device_waiting(events: list[dict[str, Any]]) -> None:
    """`bind.answered`: request_id, namespace, vmi, devices, result, node, moved, message, detail, duration_ms;
    `device.waiting`: namespace, device, message and the detail the tenant's message leaves out."""
    w, view, kube = writer()
    view.apply(kinds.NODE, node("n1", {A10: 1}))
    view.apply(kinds.GPU_CLASS, gpu_class("a10"))
    binder = Binder(view.cluster, w, incomplete_after=30, concurrency=8)
    view.subscribe(binder.changed)
    seen(view, kube, device("a", status=request("r1", "vm", ["a"], now())))
    seen(view, kube, device("big", count=2))

    def decided() -> bool:
        return bool(_named(events, "bind.answered")) and bool(_named(events, "device.waiting"))

    assert asyncio.run(run_until(binder.run, decided))
    [answered] = _named(events, "bind.answered")
    keys = {"request_id", "namespace", "vmi", "devices", "result", "node", "moved", "message", "detail", "duration_ms"}
    assert keys <= answered.keys()
    assert (answered["request_id"], answered["namespace"], answered["vmi"]) == ("r1", NS, "vm")
    assert (answered["result"], answered["node"], answered["devices"]) == ("Succeeded", "n1", ["a"])
    [waiting] = [e for e in _named(events, "device.waiting") if e["device"] == "big"]
    assert waiting["namespace"] == NS and "no node has 2 free units" in waiting["message"]
    assert "node n1" in waiting["detail"] and "node n1" not in waiting["message"]
