"""§10, one active replica: who takes, renews or waits for the Lease."""

from __future__ import annotations

import datetime as dt

from cozygpu.decisions.leadership import RETRY, Take, Wait, decide, look_again, micro_time, record

NOW = dt.datetime(2026, 12, 3, 9, 0, 0, 123456, tzinfo=dt.UTC)
TERM = dt.timedelta(seconds=15)


def lease(holder: str, renewed: dt.datetime, transitions: int = 2) -> dict[str, object]:
    return {
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 15,
            "renewTime": micro_time(renewed),
            "acquireTime": micro_time(renewed),
            "leaseTransitions": transitions,
        }
    }


def test_no_lease_is_created_with_me_holding_it() -> None:
    """The first candidate creates the Lease; a MicroTime keeps microseconds."""
    take = decide(None, "pod-a", NOW, TERM, NOW)
    assert isinstance(take, Take) and take.create and take.transition
    assert take.spec["holderIdentity"] == "pod-a"
    assert take.spec["renewTime"] == "2026-12-03T09:00:00.123456Z"


def test_my_own_lease_is_renewed_even_after_a_restart() -> None:
    """Same identity (a restarted container of the same pod): renew at once, no waiting out the term."""
    take = decide(lease("pod-a", NOW - dt.timedelta(seconds=60)), "pod-a", NOW, TERM, NOW)
    assert isinstance(take, Take) and not take.create and not take.transition
    assert take.spec["renewTime"] == micro_time(NOW)
    assert take.spec["leaseTransitions"] == 2


def test_someone_elses_lease_is_waited_for_a_term_from_when_it_was_last_seen_to_change() -> None:
    """Seen unchanged for 5 s of a 15 s term: wait 10 s more, whatever the holder's clock wrote in renewTime."""
    seen = NOW - dt.timedelta(seconds=5)
    held = lease("pod-a", NOW + dt.timedelta(hours=3))  # a skewed clock on the holder's machine changes nothing
    assert decide(held, "pod-b", NOW, TERM, seen) == Wait("pod-a", NOW + dt.timedelta(seconds=10))


def test_an_expired_lease_is_taken_over_counting_the_transition() -> None:
    """Seen unchanged for a whole term: the holder is gone; take it and count one more transition."""
    take = decide(lease("pod-a", NOW), "pod-b", NOW, TERM, NOW - dt.timedelta(seconds=16))
    assert isinstance(take, Take) and not take.create and take.transition
    assert (take.spec["holderIdentity"], take.spec["leaseTransitions"]) == ("pod-b", 3)


def test_a_released_or_unreadable_lease_is_free() -> None:
    """An empty holder (released on a clean stop) is taken at once."""
    assert isinstance(decide(lease("", NOW), "pod-b", NOW, TERM, NOW), Take)


def test_a_renewal_or_a_new_holder_is_a_new_record() -> None:
    """The record a waiting candidate times changes with each renewal, so a live holder is never taken over."""
    assert record(lease("pod-a", NOW)) != record(lease("pod-a", NOW + dt.timedelta(seconds=5)))
    assert record(lease("pod-a", NOW)) != record(lease("pod-b", NOW))
    assert record(None) == ("", "", 0)


def _takeover(first_read: float, killed_after: int = 6) -> tuple[float, float]:
    """Simulated time: the holder renews every third of the term from 0 and dies right after renewal
    `killed_after`; a candidate reads from `first_read` on, paced by `look_again`, timing the term from when it
    first saw each record as the executor does. (When it took over, when the dead holder last renewed.)"""
    step = TERM.total_seconds() / 3
    last = killed_after * step
    t, seen = first_read, None
    while True:
        renewed = min(t // step * step, last)
        held = lease("pod-a", NOW + dt.timedelta(seconds=renewed))
        now = NOW + dt.timedelta(seconds=t)
        if seen is None or seen[0] != record(held):
            seen = (record(held), now)
        decision = decide(held, "pod-b", now, TERM, seen[1])
        if isinstance(decision, Take):
            return t, last
        t += look_again(decision, now, TERM)


def test_a_dead_holder_is_taken_over_within_the_term_and_the_retry_period_whatever_the_phase() -> None:
    """§10: killed right after a renewal, at every phase of the candidate's reads, the Lease is taken over no
    sooner than a term after that renewal and no later than a term plus the retry period. Before, a candidate
    read every third of a term and took over up to 4/3 of a term after the renewal."""
    afters = [t - last for t, last in (_takeover(phase / 100) for phase in range(0, 500, 7))]
    assert min(afters) >= TERM.total_seconds()
    assert max(afters) <= (TERM + RETRY).total_seconds() + 0.01, max(afters)


def test_a_live_holder_is_never_taken_over_by_a_candidate_reading_every_retry_period() -> None:
    """The holder renews every third of a term: however often a candidate reads, it never sees one record for a
    whole term, so it waits (the renewal it has not seen yet only makes it wait longer)."""
    step = TERM.total_seconds() / 3
    seen = None
    t = 0.3
    while t < 120:
        held = lease("pod-a", NOW + dt.timedelta(seconds=t // step * step))
        now = NOW + dt.timedelta(seconds=t)
        if seen is None or seen[0] != record(held):
            seen = (record(held), now)
        decision = decide(held, "pod-b", now, TERM, seen[1])
        assert isinstance(decision, Wait)
        t += look_again(decision, now, TERM)
