"""The VMI webhook's checks as one call (decisions.plans, §3.5-§3.9, issue 35 item 3): the plan of what to write,
or the refusal of the first rule the set breaks, in the spec's order."""

from __future__ import annotations

from typing import Any

from cozygpu.api import GPUDevice
from cozygpu.decisions.admission import Member
from cozygpu.decisions.outputs import DEVICE_PLUGIN
from cozygpu.decisions.plans import Plan, plan
from cozygpu.state.cluster import Cluster
from tests.support.views import A10, budget, cluster, device, gpu_class, node


def _member(c: Cluster, body: dict[str, Any], index: int, template: bool = False) -> Member:
    d = GPUDevice.from_wire(body)
    return Member(d, c.classes[d.spec.class_name], index, template=template)


def _vmi(**devices: Any) -> dict[str, Any]:
    return {"metadata": {"name": "vm", "namespace": "t1"}, "spec": {"domain": {"devices": devices}}}


def _plan(c: Cluster, vmi: dict[str, Any], members: list[Member]) -> Plan | str:
    return plan(c, vmi, "t1", members, output=DEVICE_PLUGIN, prior=[])


def test_a_set_that_passes_every_rule_is_planned_with_its_entries_and_new_orders() -> None:
    """A held device and a new template device: one gpus entry per unit, and the template's order, by name."""
    c = cluster(nodes=[node("n1", {A10: 4})], classes=[gpu_class("a10")])
    held = _member(c, device("h", phase="Bound", node_name="n1"), 0)
    new = _member(c, device("vm-gpu-1", count=2), 1, template=True)
    planned = _plan(c, _vmi(), [held, new])
    assert isinstance(planned, Plan)
    assert [e["name"] for e in planned.entries] == ["gpudev0-0", "gpudev1-0", "gpudev1-1"]
    assert list(planned.orders) == ["vm-gpu-1"] and planned.orders["vm-gpu-1"].count == 2


def test_the_first_rule_broken_is_the_refusal() -> None:
    """A device named twice is refused before the VMI's own entries, and those before the budgets."""
    c = cluster(
        nodes=[node("n1", {A10: 4})],
        classes=[gpu_class("a10")],
        budgets=[budget("b", "t1", limits={"a10": 0})],
    )
    twice = [_member(c, device("h"), 0), _member(c, device("h"), 1)]
    own = _vmi(gpus=[{"name": "mine", "deviceName": A10}])
    assert _plan(c, own, twice) == "GPUDevice h is referenced twice"
    new = [_member(c, device("vm-gpu-0"), 0, template=True)]
    refused = _plan(c, own, new)
    assert isinstance(refused, str) and refused.startswith("the VMI carries GPU entries of its own")
    over = _plan(c, _vmi(), new)
    assert isinstance(over, str) and "GPUBudget" in over
