"""The binder's waiting room (runtime.workers.binder.queue, §5.5, §14.3): what the view's changes name becomes the
next pass's work; what a pass left when it stepped aside comes first next time."""

from __future__ import annotations

from cozygpu.api import kinds
from cozygpu.runtime.view import View
from cozygpu.runtime.workers.binder.queue import WaitingRoom
from tests.support.views import A10, EPOCH, cluster, device, gpu_class, node, request


def _room(*devices: dict[str, object]) -> tuple[WaitingRoom, View]:
    c = cluster(classes=[gpu_class("a10", A10)], nodes=[node("n1", {A10: 1})], devices=list(devices))
    view, queue = View(c), WaitingRoom(c)
    view.subscribe(lambda change: queue.changed(change, frozenset()))
    return queue, view


def test_the_first_pass_takes_every_waiting_device_in_turn_and_then_only_what_changes_name() -> None:
    """A binder taking the Lease decides everything the view holds once; after that, a device's event names it."""
    queue, view = _room(device("a", created=1), device("b", created=2))
    queue.listen()
    musts, _ = queue.next_pass()
    assert [d.name for d in musts] == ["a", "b"]
    assert queue.next_pass()[0] == []
    view.apply(kinds.GPU_DEVICE, device("b", created=2, phase="Pending"))
    assert [d.name for d in queue.next_pass()[0]] == ["b"]


def test_a_standby_hears_nothing() -> None:
    """§10: only the Lease holder's waiting room fills from the view."""
    queue, view = _room(device("a"))
    view.apply(kinds.GPU_DEVICE, device("a", phase="Pending"))
    assert not queue.wake.is_set()
    queue.listen()
    view.apply(kinds.GPU_DEVICE, device("a", phase="Pending", node_name="n1"))
    assert queue.wake.is_set()


def test_what_a_pass_left_comes_first_next_time_and_a_request_makes_it_step_aside() -> None:
    """The rest of a pass that stepped aside is decided first, in its order; a bind request arriving is a reason
    to step aside."""
    queue, view = _room(device("a", created=1), device("b", created=2), device("c", created=3))
    queue.listen()
    musts, room = queue.next_pass()
    queue.keep(musts, 2, False, room)  # stopped at the second device, "b"
    assert [d.name for d in queue.next_pass()[0]] == ["b", "c"]
    assert not queue.stepping_aside()
    view.apply(kinds.GPU_DEVICE, device("a", created=1, status=request("r1", "vm", ["a"], EPOCH)))
    assert queue.stepping_aside()
