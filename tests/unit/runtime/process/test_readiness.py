"""What ready means for a replica (§10), as a rule over a snapshot (runtime.process.health, issue 35 item 4): each
reason it is not ready, in the order a probe reports them, and the role it reports once ready."""

from __future__ import annotations

from cozygpu.runtime.process.health import Replica, readiness

READY = Replica(stopping=False, synced=True, serving=True, unregistered=False, role="leader")


def test_a_synced_serving_replica_is_ready_and_says_its_role() -> None:
    """Leader or standby alike: every synced replica serves admissions; the text says which it is."""
    assert readiness(READY) == (True, "leader")
    assert readiness(Replica(False, True, True, False, role="standby, the Lease is held")) == (
        True,
        "standby, the Lease is held",
    )
    assert readiness(Replica(False, True, True, False)) == (True, "")


def test_each_reason_it_is_not_ready_is_said_and_the_first_one_wins() -> None:
    """Stopping before unsynced before not serving before unregistered (dev) before a stopped task, a failing
    worker (by name) and a failing watch."""
    cases = [
        (Replica(True, False, False, True), "stopping: answering the admissions under way"),
        (Replica(False, False, False, True), "the cluster view has not synced yet"),
        (Replica(False, True, False, True), "the admission webhooks are not serving yet"),
        (Replica(False, True, True, True), "the admission webhooks are not registered yet"),
        (Replica(False, True, True, False, stopped=["watch"], failing=[("binder", "x")]), "watch stopped"),
        (
            Replica(False, True, True, False, failing=[("collector", "boom"), ("binder", "bang")]),
            "binder failed and is starting again: bang",
        ),
        (Replica(False, True, True, False, watches=[("gpudevices", "410")]), "the watch of gpudevices is failing: 410"),
    ]
    for replica, why in cases:
        assert readiness(replica) == (False, why), replica
