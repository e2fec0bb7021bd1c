"""Leader election over a coordination.k8s.io Lease (§10: one active binder).

Every replica lists, watches and serves admissions; the Operator calls `acquire` once its
view has synced, starts the workers only the holder runs, and then runs `hold`, which
renews the Lease. A replica that cannot renew within its term, or
finds another holder, calls `on_lost`: it must stop deciding at once, since another
replica may already be. `release` on a clean stop lets a successor start without
waiting out the term. Decisions about the Lease are `decisions.leadership`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import socket
import time
from collections.abc import Callable
from typing import Any

import structlog

from cozygpu.api import kinds
from cozygpu.api.meta import now as utcnow
from cozygpu.decisions.leadership import Take, Wait, decide, look_again, record
from cozygpu.kube import credentials
from cozygpu.kube.adapter import AlreadyExists, ApiError, AsyncKube, Conflict, NotFound
from cozygpu.settings import Settings

log = structlog.get_logger("cozygpu.leader")

LEASE = kinds.kind("Lease")
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def replica(settings: Settings) -> str:
    """This replica's name: in the Lease, and to kopf (which would otherwise ask the OS for a user name,
    and fail for a uid /etc/passwd does not know, as a cluster's random runAsUser is)."""
    return settings.identity or socket.gethostname()


def for_settings(settings: Settings, kube: AsyncKube, *, on_lost: Callable[[], None]) -> Leadership | None:
    """The replica's Leadership, or None when leader election is off."""
    if not settings.leader_election:
        return None
    return Leadership(
        kube,
        namespace=lease_namespace(settings),
        name=settings.lease_name,
        identity=replica(settings),
        duration=settings.lease_duration,
        on_lost=on_lost,
    )


def lease_namespace(settings: Settings) -> str:
    """The setting, else the kubeconfig's namespace, else the pod's service account's, else default."""
    if settings.lease_namespace:
        return settings.lease_namespace
    if settings.kubeconfig is not None:
        return credentials.from_kubeconfig(settings.kubeconfig).namespace
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE) as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


class Leadership:
    def __init__(
        self,
        kube: AsyncKube,
        *,
        namespace: str,
        name: str,
        identity: str,
        duration: float,
        on_lost: Callable[[], None],
    ) -> None:
        self._kube = kube
        self._namespace, self._name, self.identity = namespace, name, identity
        self._duration = dt.timedelta(seconds=duration)
        self._on_lost = on_lost
        self._seen: tuple[tuple[str, str, int], dt.datetime] | None = None  # a record and when we first saw it
        self._renewed = 0.0  # monotonic time of our last successful write
        self.leading = False

    async def acquire(self, waiting: Callable[[str], None]) -> None:
        """Until this replica holds the Lease; `waiting` hears why not, for readiness."""
        while True:
            outcome = await self._round()
            if outcome is None:
                self.leading = True
                log.info("leader.acquired", identity=self.identity, lease=f"{self._namespace}/{self._name}")
                return
            waiting(f"waiting to lead: Lease {self._namespace}/{self._name} is held by {outcome.holder}")
            await asyncio.sleep(look_again(outcome, utcnow(), self._duration))

    async def hold(self) -> None:
        """Renew every third of a term; give up (on_lost) when another holds it or no renewal landed for two
        thirds of a term: a standby waits a whole term from the last change it saw, so we stop first."""
        deadline = self._duration.total_seconds() * 2 / 3
        pause = self._duration.total_seconds() / 3
        while True:
            await asyncio.sleep(pause)
            try:
                outcome = await self._round()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the API or the network: a renewal that did not land, nothing more
                log.warning(
                    "leader.renew_failed", error=e.message if isinstance(e, ApiError) else str(e) or type(e).__name__
                )
                pause = 1.0
                if time.monotonic() - self._renewed < deadline:
                    continue
                outcome = Wait("nobody: no renewal landed within the deadline", utcnow())
            if outcome is None:
                pause = self._duration.total_seconds() / 3
                continue
            self.leading = False
            log.error("leader.lost", identity=self.identity, holder=outcome.holder)
            self._on_lost()
            return

    async def release(self) -> None:
        """Hand the Lease back on a clean stop, if it is still ours."""
        if not self.leading:
            return
        self.leading = False
        try:
            lease = await self._kube.get_or_none(LEASE, self._name, self._namespace)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"]["holderIdentity"] = ""
            await self._kube.replace(LEASE, lease)
            log.info("leader.released", identity=self.identity)
        except ApiError as e:
            log.warning("leader.release_failed", error=e.message)

    async def _round(self) -> Wait | None:
        """One read-decide-write; None when this replica holds the Lease afterwards."""
        lease = await self._kube.get_or_none(LEASE, self._name, self._namespace)
        now = utcnow()
        current = record(lease)
        if self._seen is None or self._seen[0] != current:
            self._seen = (current, now)
        decision = decide(lease, self.identity, now, self._duration, self._seen[1])
        if isinstance(decision, Wait):
            return decision
        try:
            await self._write(lease, decision)
        except (Conflict, AlreadyExists, NotFound):
            return Wait("another candidate", now)  # someone wrote first: read again
        self._renewed = time.monotonic()
        return None

    async def _write(self, lease: dict[str, Any] | None, decision: Take) -> None:
        meta: dict[str, Any] = {"name": self._name, "namespace": self._namespace}
        if lease is not None:
            meta["resourceVersion"] = lease["metadata"]["resourceVersion"]
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": decision.spec}
        if decision.create:
            await self._kube.create(LEASE, body)
        else:
            await self._kube.replace(LEASE, body)
        if decision.transition:
            log.info("leader.transition", identity=self.identity, transitions=decision.spec.get("leaseTransitions"))
