"""The VMI webhook's early budget check counts template orders of other admissions still in flight (issue 34
item 6, §7.4): an order checked but whose device is not created yet holds its units from the check on."""

from __future__ import annotations

import asyncio
from typing import Any

from cozygpu.api import kinds
from cozygpu.api.kinds import Kind
from cozygpu.runtime.admission.reservations import Reservations
from cozygpu.runtime.admission.vmi_webhook import Refusal, VMIAdmission
from cozygpu.runtime.admission.waiters import Waiters
from tests.support.bodies import vmi_body
from tests.support.views import A10, budget, gpu_class, node
from tests.support.writing import NS, writer

Body = dict[str, Any]


def _vmi(name: str) -> Body:
    return vmi_body(name, NS, [{"deviceTemplate": {"className": "a10", "count": 1}}])


async def _second_while_first_creates() -> tuple[BaseException | None, bool, list[Any]]:
    """Two VMIs of one template unit each under a budget of one unit: the second is admitted while the first's
    device create is on its way. What became of the second (None: still under way), and what stays reserved."""
    w, view, kube = writer()
    view.apply(kinds.NODE, node("n1", {A10: 8}))
    view.apply(kinds.GPU_CLASS, kube.put(kinds.GPU_CLASS, gpu_class("a10")))
    view.apply(kinds.GPU_BUDGET, budget("cap", limits={"a10": 1}))
    reservations = Reservations(ttl=30)
    admission = VMIAdmission(view.cluster, Waiters(), reservations, bind_timeout=0.05, max_devices=8, writer=w)
    arrived, go = asyncio.Event(), asyncio.Event()
    create = kube.create

    async def slow_create(kind: Kind, body: Body, *, dry_run: bool = False) -> Body:
        arrived.set()
        await go.wait()
        return await create(kind, body, dry_run=dry_run)

    kube.create = slow_create  # type: ignore[method-assign]
    first = asyncio.create_task(admission.admit(_vmi("first"), dry_run=False))
    await arrived.wait()
    second = asyncio.create_task(admission.admit(_vmi("second"), dry_run=False))
    for _ in range(100):  # every step the second can take without the API's answer
        await asyncio.sleep(0)
    outcome = second.exception() if second.done() else None
    go.set()
    await asyncio.gather(first, second, return_exceptions=True)  # no binder runs: the first is refused in time
    return outcome, second.done(), reservations.orders()


def test_a_template_order_in_flight_counts_in_the_next_early_check() -> None:
    """The second VMI is refused at once by the early check, naming the budget, while the first's device is still
    being created (before, it passed and created its own device, to be refused only by the binder's check); and
    nothing stays reserved once both are done."""
    outcome, _, left = asyncio.run(_second_while_first_creates())
    assert isinstance(outcome, Refusal), outcome
    assert "GPUBudget t1/cap allows 1" in str(outcome)
    assert left == []
