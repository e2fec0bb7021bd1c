"""The one writer: every API write the operator's workers make to the objects the view holds.

The binder, the collector, the accountant and the VMI webhook call it. Each write
goes out under the object's resourceVersion, and its response goes into the view
through the one door (runtime.view), which tells the subscribed workers. There is
one conflict policy: on a Conflict or NotFound, read the object fresh and put that
in the view (or forget it), and tell the caller it did not write. The binder's
decisions in flight (assumptions, §13.1) are settled here too, in the same step as
the API's version goes in, so no one sees the view without either.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class Outcome:
    """`written`: our write landed and `body` is the API's answer. Otherwise someone wrote first or the
    object is gone: `body` is what a fresh read found, in the view now (None: gone, or the read failed
    on an assumed device, which is then re-read later)."""

    written: bool
    body: Body | None


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

    async def replace(self, kind: kinds.Kind, body: Body) -> Outcome:
        return await self._write(self._kube.replace, kind, body, None)

    async def create(self, kind: kinds.Kind, body: Body, *, existing_ok: bool = False) -> Body | None:
        """Create; with `existing_ok`, an object of the name already there is read into the view and returned
        (None if it went meanwhile). Otherwise AlreadyExists is raised."""
        try:
            created = await self._kube.create(kind, body)
            self._landed(kind, body)
        except AlreadyExists:
            if not existing_ok:
                raise
            namespace, name = _where(body)
            return (await self.refresh(kind, name, namespace)).body
        self._view.apply(kind, created)
        return created

    async def delete(
        self,
        kind: kinds.Kind,
        name: str,
        namespace: str = "",
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        at_once: bool = False,
    ) -> bool:
        """Delete (with a UID or resourceVersion precondition if given: Conflict when it fails); False when it
        was gone already, and the view forgets it.
        `at_once`: the object carries no finalizers, so the view forgets it now; otherwise what the deletion
        leaves (finalizers pending) the watch reports."""
        before = self._version(kind, namespace, name)
        if await self._kube.delete(kind, name, namespace or None, uid=uid, resource_version=resource_version):
            self._landed(kind, {"metadata": {"namespace": namespace, "name": name}})
            if at_once:
                self._gone(kind, namespace, name, before)
            return True
        self._gone(kind, namespace, name, before)
        return False

    async def refresh(
        self, kind: kinds.Kind, name: str, namespace: str = "", *, assumption: int | None = None
    ) -> Outcome:
        """Read the object fresh into the view (or forget it). With `assumption`, it is settled in the same
        step; a failed read keeps it (its units stay counted) until `recheck` reads again."""
        key = (namespace, name)
        before = self._version(kind, namespace, name)
        try:
            fresh = await self._kube.get_or_none(kind, name, namespace or None)
        except Exception as e:
            if assumption is None:
                raise
            self._doubtful[key] = assumption
            log.warning("write.refresh_failed", kind=kind.kind, namespace=namespace or None, name=name, error=str(e))
            return Outcome(False, None)
        if assumption is not None:
            self._doubtful.pop(key, None)
            if not self._view.settle(namespace, name, assumption):
                return Outcome(False, fresh)  # another decision of ours is in flight on it: its write settles it
        if fresh is None:
            self._gone(kind, namespace, name, before)
        else:
            self._view.apply(kind, fresh)
        return Outcome(False, fresh)

    def _version(self, kind: kinds.Kind, namespace: str, name: str) -> int | None:
        return self._view.cluster.stored_version(kind, (namespace, name) if kind.namespaced else name)

    def _gone(self, kind: kinds.Kind, namespace: str, name: str, before: int | None) -> None:
        """The API had no object of the name when asked: the view forgets what it held then, but not what
        arrived while the call was in flight (a create of the same name answered meanwhile), which a forget
        by name would drop and bury at its own version, out of sight of every later list."""
        now = self._version(kind, namespace, name)
        if now is None or (before is not None and now <= before):
            self._view.forget(kind, namespace, name)

    def _landed(self, kind: kinds.Kind, body: Body) -> None:
        self._writes += 1
        if self._writes == self._crash_at:
            namespace, name = _where(body)
            log.warning("crash.injected", write=self._writes, kind=kind.kind, namespace=namespace, name=name)
            os._exit(CRASHED)

    async def recheck(self) -> None:
        """Read again the assumed devices whose outcome is still unknown."""
        for (namespace, name), token in list(self._doubtful.items()):
            await self.refresh(kinds.GPU_DEVICE, name, namespace, assumption=token)

    async def _write(
        self, call: Callable[[kinds.Kind, Body], Awaitable[Body]], kind: kinds.Kind, body: Body, assumption: int | None
    ) -> Outcome:
        namespace, name = _where(body)
        try:
            response = await call(kind, body)
            self._landed(kind, body)
        except (Conflict, NotFound):
            return await self.refresh(kind, name, namespace, assumption=assumption)
        except Exception:
            if assumption is not None:  # an unknown outcome: what the API has now is the truth
                await self.refresh(kind, name, namespace, assumption=assumption)
            raise
        if assumption is not None:
            self._view.settle(namespace, name, assumption)
        self._view.apply(kind, response)
        return Outcome(True, response)
