"""The one writer: every API write the operator's workers make to the objects the view holds, and their fresh reads.

The binder, the collector, the accountant and the VMI webhook call it. Each write
goes out under the object's resourceVersion, and its response goes into the view
through the one door (runtime.view), which tells the subscribed workers. Every call
answers with one `Outcome` (issue 20 item 4), under one conflict policy: a write that
did not land (Conflict, NotFound, AlreadyExists, a failed precondition) is followed by
one fresh read, which goes into the view (or makes it forget the object) and is the
outcome's body, so a caller decides again on it without reading it again. Any other
failure is an unknown outcome and is raised. The binder's decisions in flight
(assumptions, §13.1) are settled here too, in the same step as the API's version goes
in, so no one sees the view without either.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from cozygpu.api import GPUDevice, kinds
from cozygpu.kube.adapter import AlreadyExists, AsyncKube, Conflict, NotFound
from cozygpu.runtime.view import View
from cozygpu.state.cluster import Assumption

log = structlog.get_logger("cozygpu.writes")

CRASHED = 75  # the exit status of an injected crash (tests/reliability)

Body = dict[str, Any]


class State(enum.Enum):
    LANDED = "landed"  # our write landed: the body is the API's answer (None for a delete)
    CURRENT = "current"  # a read found the object: the body is the API's version
    CONFLICT = "conflict"  # someone wrote first, or the name is taken: the body is a fresh read
    GONE = "gone"  # the API has no object of the name: the view forgot what it held of it
    UNKNOWN = "unknown"  # an assumed device's fresh read failed: it stays counted until `recheck`


@dataclass(frozen=True)
class Outcome:
    """What one Writer call did. Every body it carries is in the view already, but for a CURRENT or
    CONFLICT read of a device another decision of ours is in flight on (that decision's write settles it)."""

    state: State
    body: Body | None = None

    @property
    def written(self) -> bool:
        return self.state is State.LANDED


# How often a read-decide-write loop decides again on what another writer wrote first (`Writer.update`).
RETRIES = 5

# One write to make (a replace, a patch, a delete under a precondition), made when awaited.
Step = Callable[[], Awaitable[Outcome]]


def _where(body: Body) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class Writer:
    def __init__(self, view: View, kube: AsyncKube, *, crash_at: int = 0) -> None:
        self._view = view
        self._kube = kube
        # Tests only (tests/reliability): end the process right after the Nth write lands, before the view
        # or the caller hears of it, as a crash at that very point would.
        self._crash_at = crash_at
        self._writes = 0
        # Assumed devices whose write had an unknown outcome and whose fresh read failed too.
        self._doubtful: dict[tuple[str, str], int] = {}

    def assume(self, device: GPUDevice) -> Assumption:
        """Count the binder's decision in the view before its write (§13.1); the write carries the token."""
        return self._view.assume(device)

    @property
    def doubtful(self) -> bool:
        return bool(self._doubtful)

    async def replace_status(self, kind: kinds.Kind, body: Body, *, assumption: int | None = None) -> Outcome:
        """Write the status subresource; `assumption`: the token of the binder's decision this write carries
        (`assume`), settled by the API's answer or a fresh read, whatever the outcome."""
        return await self._write(self._kube.replace_status, kind, body, assumption)

    async def update(
        self, current: Body | None, decide: Callable[[Body | None], Awaitable[Step | None]], *, tries: int = RETRIES
    ) -> Outcome:
        """Decide on `current` and write; whenever someone wrote first, decide again on what the API has now (the
        write's CONFLICT carries it), as client-go's RetryOnConflict: the one read-decide-write loop. `decide`
        returns the write to make, or None when nothing is left to write (then CURRENT, with what it decided on).
        The outcome is the landing write's (GONE: the object went), or after `tries` conflicts the last CONFLICT."""
        for _ in range(tries):
            step = await decide(current)
            if step is None:
                return Outcome(State.CURRENT, current)
            outcome = await step()
            if outcome.state is not State.CONFLICT:
                return outcome
            current = outcome.body
        return Outcome(State.CONFLICT, current)

    async def replace(self, kind: kinds.Kind, body: Body) -> Outcome:
        return await self._write(self._kube.replace, kind, body, None)

    async def patch(self, kind: kinds.Kind, name: str, namespace: str, changes: Body) -> Outcome:
        """A merge patch setting the fields `changes` holds, whole; under its `metadata.resourceVersion` if given (a
        stale one is a CONFLICT, as for a replace). For objects the view keeps slim (a GPUDevice's metadata, issue 34
        item 2): a replace from the view's copy would drop what the view left out."""
        where = {"metadata": {"name": name, "namespace": namespace}}
        return await self._write(lambda k, _: self._kube.patch(k, name, changes, namespace or None), kind, where, None)

    async def create(self, kind: kinds.Kind, body: Body) -> Outcome:
        """Create; a name already taken is a CONFLICT whose body is the object there (GONE if it went meanwhile)."""
        return await self._write(self._kube.create, kind, body, None)

    async def delete(
        self,
        kind: kinds.Kind,
        name: str,
        namespace: str = "",
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        at_once: bool = False,
    ) -> Outcome:
        """Delete, with a UID or resourceVersion precondition if given (a failed one is a CONFLICT).
        `at_once`: the object carries no finalizers, so the view forgets it now; otherwise what the deletion
        leaves (finalizers pending) the watch reports."""
        before = self._version(kind, namespace, name)
        try:
            deleted = await self._kube.delete(kind, name, namespace or None, uid=uid, resource_version=resource_version)
        except Conflict:
            return await self._reread(kind, name, namespace)
        if not deleted:
            self._gone(kind, namespace, name, before)
            return Outcome(State.GONE)
        self._landed(kind, {"metadata": {"namespace": namespace, "name": name}})
        if at_once:
            self._gone(kind, namespace, name, before)
        return Outcome(State.LANDED)

    async def read(self, kind: kinds.Kind, name: str, namespace: str = "", *, assumption: int | None = None) -> Outcome:
        """Read the object fresh into the view (or forget it): CURRENT or GONE. With `assumption`, it is settled
        in the same step; a failed read keeps it (its units stay counted, UNKNOWN) until `recheck` reads again.
        Without, a failed read is raised."""
        return await self._read(kind, name, namespace, assumption, State.CURRENT)

    async def recheck(self) -> None:
        """Read again the assumed devices whose outcome is still unknown."""
        for (namespace, name), token in list(self._doubtful.items()):
            await self.read(kinds.GPU_DEVICE, name, namespace, assumption=token)

    # -- the one policy ----------------------------------------------------------

    async def _write(
        self, call: Callable[[kinds.Kind, Body], Awaitable[Body]], kind: kinds.Kind, body: Body, assumption: int | None
    ) -> Outcome:
        namespace, name = _where(body)
        try:
            response = await call(kind, body)
            self._landed(kind, body)
        except (Conflict, NotFound, AlreadyExists):
            return await self._reread(kind, name, namespace, assumption)
        except Exception:
            if assumption is not None:  # an unknown outcome: what the API has now is the truth
                await self._read(kind, name, namespace, assumption, State.CONFLICT)
            raise
        if assumption is not None:
            self._settle(namespace, name, assumption)
        self._view.apply(kind, response)
        return Outcome(State.LANDED, response)

    async def _reread(self, kind: kinds.Kind, name: str, namespace: str, assumption: int | None = None) -> Outcome:
        """A write that did not land: what the API has now goes into the view and answers the caller."""
        return await self._read(kind, name, namespace, assumption, State.CONFLICT)

    async def _read(self, kind: kinds.Kind, name: str, namespace: str, assumption: int | None, found: State) -> Outcome:
        key = (namespace, name)
        before = self._version(kind, namespace, name)
        try:
            fresh = await self._kube.get_or_none(kind, name, namespace or None)
        except Exception as e:
            if assumption is None:
                raise
            self._doubtful[key] = assumption
            log.warning("write.refresh_failed", kind=kind.kind, namespace=namespace or None, name=name, error=str(e))
            return Outcome(State.UNKNOWN)
        outcome = Outcome(found, fresh) if fresh is not None else Outcome(State.GONE)
        if assumption is not None:
            self._doubtful.pop(key, None)
            if not self._settle(namespace, name, assumption):
                return outcome  # another decision of ours is in flight on it: its write settles it
        if fresh is None:
            self._gone(kind, namespace, name, before)
        else:
            self._view.apply(kind, fresh)
        return outcome

    # -- the view's side -----------------------------------------------------------

    def _settle(self, namespace: str, name: str, assumption: int) -> bool:
        # The one place assumptions are settled (§13.1): through the door, like any change of the view.
        return self._view.settle(namespace, name, assumption)

    def _version(self, kind: kinds.Kind, namespace: str, name: str) -> int | None:
        return self._view.cluster.stored_version(kind, (namespace, name) if kind.namespaced else name)

    def _gone(self, kind: kinds.Kind, namespace: str, name: str, before: int | None) -> None:
        """The API had no object of the name when asked: the view forgets what it held then, but not what
        arrived while the call was in flight (a create of the same name answered meanwhile), which a forget
        by name would drop and bury at its own version, out of sight of every later list. Nothing held,
        nothing to forget: a fresh read of a name not yet created leaves no tombstone."""
        now = self._version(kind, namespace, name)
        if now is not None and before is not None and now <= before:
            self._view.forget(kind, namespace, name)

    def _landed(self, kind: kinds.Kind, body: Body) -> None:
        self._writes += 1
        if self._writes == self._crash_at:
            namespace, name = _where(body)
            log.warning("crash.injected", write=self._writes, kind=kind.kind, namespace=namespace, name=name)
            os._exit(CRASHED)
