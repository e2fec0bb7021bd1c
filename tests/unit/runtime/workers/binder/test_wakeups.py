"""Who a change wakes (issue 20 item 3): the binder for what it decides on, an admission for its own devices."""

from __future__ import annotations

from cozygpu.api import kinds
from cozygpu.runtime.admission.waiters import Waiters
from cozygpu.runtime.view import View
from cozygpu.runtime.workers.accountant import Accountant
from cozygpu.runtime.workers.binder import Binder
from cozygpu.state.cluster import Change, Cluster
from tests.support.views import A10, cluster, device, gpu_class, node, pod


def _binder(c: Cluster) -> tuple[Binder, View]:
    view = View(c)
    binder = Binder(c, None, incomplete_after=30, concurrency=4)  # type: ignore[arg-type]  # changed() never writes
    view.subscribe(binder.changed)
    binder.listen()  # as its run does, on the Lease holder
    return binder, view


def test_a_binder_that_has_not_run_hears_no_change() -> None:
    """§10: every replica's view feeds its binder, but only the Lease holder's runs; a standby's binder hears nothing
    (its first pass on taking the Lease decides everything the view holds)."""
    c = cluster(classes=[gpu_class("a10", A10)], nodes=[node("n1", {A10: 2})], devices=[device("a")])
    view = View(c)
    binder = Binder(c, None, incomplete_after=30, concurrency=4)  # type: ignore[arg-type]  # changed() never writes
    view.subscribe(binder.changed)
    assert view.apply(kinds.GPU_DEVICE, device("a", phase="Pending")).stored
    assert not binder.queue.wake.is_set()
    binder.listen()
    assert view.apply(kinds.GPU_DEVICE, device("a", phase="Pending", node_name="n1")).stored
    assert binder.queue.wake.is_set()


def test_a_vmi_status_update_wakes_no_worker_and_no_waiting_admission() -> None:
    """A VMI's status changes all the time in a cloud; no decision, status or admission's answer depends on it."""
    c = cluster(classes=[gpu_class("a10", A10)], nodes=[node("n1", {A10: 2})], devices=[device("a")])
    binder, view = _binder(c)
    accountant = Accountant(c, None)  # type: ignore[arg-type]  # changed() never writes
    view.subscribe(accountant.changed)
    waiters = Waiters()
    view.subscribe(waiters.changed, kinds.GPU_DEVICE)
    vmi = {"metadata": {"namespace": "t1", "name": "vm", "uid": "u1", "resourceVersion": "50"}}
    assert view.apply(kinds.VMI, vmi).stored  # a new VMI: its uid is news for the collector (§6)
    with waiters.waiting([("t1", "a")]) as admission:
        vmi["metadata"]["resourceVersion"] = "51"
        vmi["status"] = {"phase": "Running"}
        assert not view.apply(kinds.VMI, vmi).stored
        assert c.stored_version(kinds.VMI, ("t1", "vm")) == 51  # a resync skips it unread all the same
        assert not binder.queue.wake.is_set()
        assert not accountant._wake.is_set()
        assert not admission.is_set()


def test_a_device_change_wakes_the_binder_and_only_the_admissions_waiting_on_that_device() -> None:
    """The device's own admission re-checks; an admission waiting on another device sleeps on."""
    c = cluster(classes=[gpu_class("a10", A10)], nodes=[node("n1", {A10: 2})], devices=[device("a"), device("b")])
    binder, view = _binder(c)
    waiters = Waiters()
    view.subscribe(waiters.changed, kinds.GPU_DEVICE)
    with waiters.waiting([("t1", "a")]) as mine, waiters.waiting([("t1", "b")]) as other:
        assert view.apply(kinds.GPU_DEVICE, device("a", phase="Pending")).stored
        assert binder.queue.wake.is_set()
        assert mine.is_set()
        assert not other.is_set()


def test_units_freed_on_a_node_wake_the_binder_with_the_class_as_hint() -> None:
    """§5.5: a pod that stops holding units frees room for the class of that resource: the binder wakes for it."""
    c = cluster(classes=[gpu_class("a10", A10)], nodes=[node("n1", {A10: 2})])
    binder, view = _binder(c)
    view.apply(kinds.POD, pod("job", {A10: 2}, node="n1"))
    binder.queue.wake.clear()
    change = view.apply(kinds.POD, pod("job", {A10: 2}, node="n1", phase="Succeeded"))
    assert change.room == {"a10"}
    assert binder.queue.wake.is_set()


def test_a_class_turning_ready_wakes_the_binder_for_its_waiting_devices() -> None:
    """§12.3: a status write that makes a class ready is no spec change, yet its waiting devices are decided
    again; a status write that leaves readiness as it was wakes nothing."""
    c = cluster(classes=[gpu_class("a10", A10, ready=False)], nodes=[node("n1", {A10: 2})])
    binder, view = _binder(c)
    binder.queue.wake.clear()
    change = view.apply(kinds.GPU_CLASS, gpu_class("a10", A10, ready=False))
    assert not change.served and not binder.queue.wake.is_set()
    change = view.apply(kinds.GPU_CLASS, gpu_class("a10", A10, ready=True))
    assert change.served == {"a10"}
    assert binder.queue.wake.is_set()


def test_a_waiter_leaves_no_trace_once_its_admission_is_answered() -> None:
    """The waiting room is per admission: once it ends, a change of its device finds nobody to wake."""
    waiters = Waiters()
    with waiters.waiting([("t1", "a")]) as event:
        pass
    waiters.changed(Change(kind=kinds.GPU_DEVICE, namespace="t1", name="a", deleted=False, stored=True))
    assert not event.is_set()
    assert waiters._by_device == {}
