"""The status changes the binder writes: exactly what §4 and §5 say, nothing more."""

from __future__ import annotations

from cozygpu.api import BindResult, GPUDevice, Phase
from cozygpu.decisions import transitions
from tests.support.views import EPOCH, device, request


def model(body: dict[str, object]) -> GPUDevice:
    return GPUDevice.from_wire(body)


def test_bound_answers_only_its_own_request() -> None:
    """Bound on a node, Succeeded on the request with that id; another id is left alone."""
    d = model(device("a", status=request("r1", "vm", ["a"], EPOCH)))
    ours = transitions.bound(d, "n1", EPOCH, "r1")
    assert (ours.status.phase, ours.status.node_name) == (Phase.BOUND, "n1")
    assert ours.status.bind_request is not None and ours.status.bind_request.result is BindResult.SUCCEEDED
    theirs = transitions.bound(d, "n1", EPOCH, "r2")
    assert theirs.status.bind_request is not None and theirs.status.bind_request.result is None


def test_refused_leaves_phase_and_node_as_they_were() -> None:
    """§4: a Failed answer moves nothing."""
    d = model(device("a", phase="Bound", node_name="n1", status=request("r1", "vm", ["a"], EPOCH)))
    out = transitions.refused(d, "r1", "no room")
    assert (out.status.phase, out.status.node_name) == (Phase.BOUND, "n1")
    assert out.status.bind_request is not None
    assert (out.status.bind_request.result, out.status.bind_request.message) == (BindResult.FAILED, "no room")


def test_waiting_makes_pending_but_keeps_lost() -> None:
    """A new device becomes Pending with the reason; a Lost one stays Lost while it waits."""
    fresh = transitions.waiting(model(device("a")), "no room", EPOCH)
    assert (fresh.status.phase, fresh.status.message) == (Phase.PENDING, "no room")
    lost = transitions.waiting(model(device("b", phase="Lost", node_name="gone")), "no room", EPOCH)
    assert lost.status.phase is Phase.LOST
    assert lost.status.message == "lost from node gone; no room"


def test_lost_keeps_the_node_it_held_units_on() -> None:
    """§1.2: nodeName of a Lost device is the node it held units on."""
    out = transitions.lost(model(device("a", phase="Bound", node_name="n1")), "node n1 is gone", EPOCH)
    assert (out.status.phase, out.status.node_name, out.status.message) == (Phase.LOST, "n1", "node n1 is gone")


def test_an_unchanged_reason_writes_the_same_status() -> None:
    """Waiting twice for the same reason changes nothing, so the binder writes nothing."""
    once = transitions.waiting(model(device("a")), "no room", EPOCH)
    assert transitions.waiting(once, "no room", EPOCH.replace(year=2030)) == once
