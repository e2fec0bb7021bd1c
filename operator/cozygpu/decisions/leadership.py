"""Who leads (§10: one active replica), decided from a coordination.k8s.io Lease.

The executor (runtime.process.leadership) reads the Lease, asks `decide`, and writes what it
says under the Lease's resourceVersion, so two candidates never both win a round.
A candidate that holds the Lease renews it; one that finds it expired takes it over. A waiting candidate
reads the Lease every retry period (`look_again`), so it sees the last renewal within that period of it
and takes over within the term plus the retry period, whatever the moment the holder died (§10).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

RETRY = dt.timedelta(seconds=2)  # §10: how often a waiting candidate reads the Lease, as client-go's retryPeriod


def micro_time(value: dt.datetime) -> str:
    """metav1.MicroTime as the API server wants it: RFC 3339 with microseconds, UTC."""
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class Take:
    """Write this spec: create the Lease (`create`), renew ours, or take over an expired one."""

    spec: dict[str, Any]
    create: bool
    transition: bool  # the holder changes (acquire or take over), not a renewal


@dataclass(frozen=True)
class Wait:
    holder: str
    until: dt.datetime  # when the holder's claim runs out, unless it renews


def record(lease: dict[str, Any] | None) -> tuple[str, str, int]:
    """What identifies one holder's claim: a renewal or a new holder changes it."""
    spec = (lease or {}).get("spec") or {}
    return (
        str(spec.get("holderIdentity") or ""),
        str(spec.get("renewTime") or ""),
        int(spec.get("leaseTransitions") or 0),
    )


def decide(
    lease: dict[str, Any] | None, me: str, now: dt.datetime, duration: dt.timedelta, observed: dt.datetime
) -> Take | Wait:
    """What `me` does about the Lease now.

    `observed` is when this candidate first saw the Lease's `record` as it is now, on its own clock:
    a holder that has not renewed for a whole term since is gone. Timing it locally rather than from
    the holder's renewTime means the two machines' clocks need not agree."""
    seconds = int(duration.total_seconds())
    if lease is None:
        fresh: dict[str, Any] = {
            "holderIdentity": me,
            "leaseDurationSeconds": seconds,
            "acquireTime": micro_time(now),
            "renewTime": micro_time(now),
            "leaseTransitions": 0,
        }
        return Take(fresh, create=True, transition=True)
    spec: dict[str, Any] = dict(lease.get("spec") or {})
    holder = str(spec.get("holderIdentity") or "")
    if holder == me:
        return Take({**spec, "leaseDurationSeconds": seconds, "renewTime": micro_time(now)}, False, False)
    held_for = dt.timedelta(seconds=int(spec.get("leaseDurationSeconds") or seconds))
    if holder and now < observed + held_for:
        return Wait(holder, observed + held_for)
    transitions = int(spec.get("leaseTransitions") or 0) + (1 if holder else 0)
    taken = {
        **spec,
        "holderIdentity": me,
        "leaseDurationSeconds": seconds,
        "acquireTime": micro_time(now),
        "renewTime": micro_time(now),
        "leaseTransitions": transitions,
    }
    return Take(taken, create=False, transition=True)


def retry_period(duration: dt.timedelta) -> dt.timedelta:
    """How often a waiting candidate reads the Lease: `RETRY`, or a third of a short term."""
    return min(RETRY, duration / 3)


def look_again(wait: Wait, now: dt.datetime, duration: dt.timedelta) -> float:
    """Seconds until a waiting candidate reads the Lease again: when the holder's claim runs out if that is sooner
    than the retry period. Timing the term from a renewal seen late by a whole pause would add the pause to it."""
    until = (wait.until - now).total_seconds()
    return min(max(until, 0.2), retry_period(duration).total_seconds())
