"""An in-memory API server for fast unit tests of the writer and the workers (issue 20 item 7).

It answers the part of `cozygpu.kube.adapter.AsyncKube` they call, with the API's rules
that our logic depends on: resourceVersions that only grow (ints as strings), Conflict on
a stale one or a failed precondition, NotFound, AlreadyExists, uids, and finalizers that
hold a deletion (deletionTimestamp) until the last one is dropped. The status subresource
writes status only; the object's PUT leaves status alone. `fail_next` injects a failure.

Lists come in pages with the list's resourceVersion; a watch from a version delivers every
change after it (ADDED, MODIFIED, DELETED, and BOOKMARKs on `bookmark`) until `end_watches`
drops the streams; a version older than the last `compact` is answered with a 410 Expired
ERROR event, as the real server answers one it no longer has the history of.

It is a test of our own logic in addition to the real-API tiers (§11), never instead of them:
admission, schemas, selectors and everything else the real server does are not here.
"""

from __future__ import annotations

import asyncio
import builtins
import copy
import datetime as dt
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from cozygpu.api.kinds import Kind
from cozygpu.kube.adapter import AlreadyExists, Conflict, Invalid, NotFound

Body = dict[str, Any]
Key = tuple[str, str, str]  # plural, namespace ("" for cluster-scoped), name
T = TypeVar("T")


@dataclass
class _Failure:
    error: Exception
    method: str | None  # None: whichever call comes next
    landed: bool  # the call takes effect and then fails: an unknown outcome for the caller


@dataclass
class _Meanwhile:
    effect: Callable[[], object]
    method: str


@dataclass
class _Event:
    seq: int
    version: int
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    plural: str
    body: Body


@dataclass
class _Stream:
    stirred: asyncio.Event
    closed: bool = False


class MemKube:
    def __init__(self) -> None:
        self._objects: dict[Key, Body] = {}
        self._versions = itertools.count(1)
        self._last = 0  # the newest resourceVersion given out
        self._log: list[_Event] = []  # what watches deliver, oldest first
        self._seq = itertools.count(1)
        self._floor = 0  # a watch from a version older than this is Expired (410)
        self._streams: list[_Stream] = []
        self._uids = itertools.count(1)
        self._failures: list[_Failure] = []
        self._meanwhile: list[_Meanwhile] = []
        self._holds: list[tuple[str, asyncio.Event]] = []
        self.calls: list[tuple[str, str, str]] = []  # (method, kind, name): what the tests count

    # -- the tests' hands ----------------------------------------------------

    def fail_next(self, error: Exception, *, method: str | None = None, landed: bool = False) -> None:
        """The next call (of `method`, if given) raises `error`; with `landed`, after it took effect."""
        self._failures.append(_Failure(error, method, landed))

    def hold_status_write(self, name: str) -> asyncio.Event:
        """The next status write of an object of that name waits until the returned event is set: a slow API."""
        gate = asyncio.Event()
        self._holds.append((name, gate))
        return gate

    def before_next(self, method: str, effect: Callable[[], object]) -> None:
        """Run `effect` (someone else's write, say) just before the next call of `method`: a race lost."""
        self._meanwhile.append(_Meanwhile(effect, method))

    def put(self, kind: Kind, body: Body) -> Body:
        """Store an object as if someone else created it (no call recorded)."""
        return self._create(kind, body)

    def change(self, kind: Kind, body: Body, *, status: bool = False) -> Body:
        """Replace an object as someone else would, under the API's rules (no call recorded)."""
        return self._replace(kind, body, status=status)

    def remove(self, kind: Kind, name: str, namespace: str = "") -> Body:
        """Delete an object at once as someone else would, finalizers or not (no call recorded); its last body."""
        key = self._key(kind, name, namespace)
        gone = self._objects.pop(key)
        return self._gone(key, gone)

    def bookmark(self, kind: Kind) -> None:
        """Send a BOOKMARK at the newest version to the streams of `kind`."""
        body = {"kind": kind.kind, "apiVersion": kind.api_version, "metadata": {"resourceVersion": str(self._last)}}
        self._record("BOOKMARK", kind.plural, body)

    def end_watches(self) -> None:
        """Every open stream ends now, as a dropped connection would: what it had not delivered is not."""
        for stream in self._streams:
            stream.closed = True
            stream.stirred.set()

    def compact(self) -> None:
        """Forget the history so far: a watch from any version before now is answered 410 Expired."""
        self._floor = self._last
        self._log.clear()

    def stored(self, kind: Kind, name: str, namespace: str = "") -> Body | None:
        found = self._objects.get(self._key(kind, name, namespace))
        return copy.deepcopy(found) if found is not None else None

    def stored_all(self, kind: Kind, namespace: str | None = None) -> builtins.list[Body]:
        """Every object of the kind the API holds now, with no call recorded: for a test's checks mid-run."""
        return self._list(kind, namespace)

    def count(self, method: str) -> int:
        return sum(1 for m, _, _ in self.calls if m == method)

    # -- AsyncKube's calls ----------------------------------------------------

    async def get(self, kind: Kind, name: str, namespace: str | None = None) -> Body:
        return self._call("get", kind, name, lambda: copy.deepcopy(self._existing(kind, name, namespace)))

    async def get_or_none(self, kind: Kind, name: str, namespace: str | None = None) -> Body | None:
        def read() -> Body | None:
            found = self._objects.get(self._key(kind, name, namespace))
            return copy.deepcopy(found) if found is not None else None

        return self._call("get", kind, name, read)

    async def list(self, kind: Kind, namespace: str | None = None) -> list[Body]:
        return self._call("list", kind, "", lambda: self._list(kind, namespace))

    async def list_versioned(self, kind: Kind) -> tuple[builtins.list[Body], str]:
        return self._call("list", kind, "", lambda: (self._list(kind, None), str(self._now())))

    async def list_page(
        self, kind: Kind, limit: int, after: str = "", *, label_selector: str = "", field_selector: str = ""
    ) -> tuple[builtins.list[Body], str, str]:
        """A page of `limit` items from offset `after`, the newest version and the next offset ('' after the last).
        Every page is read afresh: a test that changes the API between pages gets what a real list would not."""
        if label_selector or field_selector:
            raise NotImplementedError("memkube lists without selectors only")

        def page() -> tuple[builtins.list[Body], str, str]:
            items, start = self._list(kind, None), int(after or 0)
            rest = start + limit
            return items[start:rest], str(self._last), str(rest) if rest < len(items) else ""

        return self._call("list", kind, "", page)

    async def watch(
        self,
        kind: Kind,
        resource_version: str,
        *,
        label_selector: str = "",
        field_selector: str = "",
        timeout: int = 240,
    ) -> AsyncIterator[tuple[str, Body]]:
        """The changes of `kind` after `resource_version`, until `end_watches` (the call is recorded with the
        version as its name). A version older than the last `compact`: one ERROR event, 410 Expired, and the end."""
        if label_selector or field_selector or not resource_version:
            raise NotImplementedError("memkube watches from a list's version, without selectors, only")
        self._call("watch", kind, resource_version, lambda: None)
        if int(resource_version) < self._floor:
            status = {
                "kind": "Status",
                "status": "Failure",
                "code": 410,
                "reason": "Expired",
                "message": f"too old resource version: {resource_version} ({self._floor})",
            }
            yield "ERROR", status
            return
        at = int(resource_version)
        seen = max((e.seq for e in self._log if e.version <= at), default=0)
        stream = _Stream(asyncio.Event())
        self._streams.append(stream)
        try:
            while not stream.closed:
                pending = [e for e in self._log if e.seq > seen and e.plural == kind.plural]
                if not pending:
                    stream.stirred.clear()
                    await stream.stirred.wait()
                    continue
                for event in pending:
                    if stream.closed:
                        return
                    seen = event.seq
                    yield event.type, copy.deepcopy(event.body)
        finally:
            self._streams.remove(stream)

    async def create(self, kind: Kind, body: Body, *, dry_run: bool = False) -> Body:
        name = str(body.get("metadata", {}).get("name") or "")
        return self._call("create", kind, name, lambda: self._create(kind, body, dry_run=dry_run))

    async def replace(self, kind: Kind, body: Body) -> Body:
        return self._call("replace", kind, body["metadata"]["name"], lambda: self._replace(kind, body, status=False))

    async def replace_status(self, kind: Kind, body: Body) -> Body:
        name = body["metadata"]["name"]
        for held in [h for h in self._holds if h[0] == name]:
            self._holds.remove(held)
            await held[1].wait()
        return self._call("replace_status", kind, name, lambda: self._replace(kind, body, status=True))

    async def patch(
        self,
        kind: Kind,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        patch_type: str = "merge",
    ) -> Body:
        if patch_type != "merge":
            raise NotImplementedError("memkube applies merge patches only")

        def apply() -> Body:
            current = self._existing(kind, name, namespace)
            merged: Body = _merge(copy.deepcopy(current), patch)
            # As the API server: a resourceVersion in the patch is a precondition.
            checked = "resourceVersion" in ((patch or {}).get("metadata") or {})
            return self._replace(kind, merged, status=subresource == "status", checked=checked)

        return self._call("patch", kind, name, apply)

    async def delete(
        self,
        kind: Kind,
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> bool:
        return self._call("delete", kind, name, lambda: self._delete(kind, name, namespace, uid, resource_version))

    async def put_object(self, kind: Kind, body: Body) -> Body:
        """Create, or replace what is there under its version: the adapter's two calls, as it makes them."""
        meta = body["metadata"]
        current = await self.get_or_none(kind, meta["name"], meta.get("namespace"))
        if current is None:
            return await self.create(kind, body)
        version = current["metadata"]["resourceVersion"]
        return await self.replace(kind, {**body, "metadata": {**meta, "resourceVersion": version}})

    def close(self) -> None:
        pass

    # -- the rules ---------------------------------------------------------------

    def _call(self, method: str, kind: Kind, name: str, effect: Callable[[], T]) -> T:
        self.calls.append((method, kind.kind, name))
        meanwhile = next((m for m in self._meanwhile if m.method == method), None)
        if meanwhile is not None:
            self._meanwhile.remove(meanwhile)
            meanwhile.effect()
        failure = next((f for f in self._failures if f.method in (None, method)), None)
        if failure is None:
            return effect()
        self._failures.remove(failure)
        if failure.landed:
            effect()
        raise failure.error

    def _key(self, kind: Kind, name: str, namespace: str | None) -> Key:
        return kind.plural, (namespace or "") if kind.namespaced else "", name

    def _now(self) -> int:
        self._last = next(self._versions)
        return self._last

    def _record(self, type_: str, plural: str, body: Body) -> None:
        version = int(body["metadata"]["resourceVersion"])
        self._log.append(_Event(next(self._seq), version, type_, plural, copy.deepcopy(body)))
        for stream in self._streams:
            stream.stirred.set()

    def _gone(self, key: Key, last: Body) -> Body:
        """Record the DELETED event of an object just removed, at a version of its own; its last body."""
        gone = copy.deepcopy(last)
        gone["metadata"]["resourceVersion"] = str(self._now())
        self._record("DELETED", key[0], gone)
        return gone

    def _existing(self, kind: Kind, name: str, namespace: str | None) -> Body:
        found = self._objects.get(self._key(kind, name, namespace))
        if found is None:
            raise NotFound(404, "NotFound", f"{kind.kind} {namespace or ''}/{name} not found")
        return found

    def _list(self, kind: Kind, namespace: str | None) -> builtins.list[Body]:
        return [
            copy.deepcopy(body)
            for (plural, ns, _), body in sorted(self._objects.items())
            if plural == kind.plural and (namespace is None or ns == namespace)
        ]

    def _create(self, kind: Kind, body: Body, *, dry_run: bool = False) -> Body:
        meta = dict(body.get("metadata") or {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{next(self._uids)}"
        key = self._key(kind, str(meta.get("name") or ""), meta.get("namespace"))
        if not key[2]:
            raise Invalid(422, "Invalid", f"{kind.kind}: metadata.name is required")
        if key in self._objects:
            raise AlreadyExists(409, "AlreadyExists", f"{kind.kind} {key[1]}/{key[2]} already exists")
        stored = copy.deepcopy(body)
        stored["metadata"] = {
            **copy.deepcopy(meta),
            "uid": f"uid-{next(self._uids)}",
            "resourceVersion": str(self._now()),
            "creationTimestamp": dt.datetime.now(dt.UTC).isoformat(),
        }
        stored["metadata"].pop("deletionTimestamp", None)
        if not dry_run:
            self._objects[key] = stored
            self._record("ADDED", kind.plural, stored)
        return copy.deepcopy(stored)

    def _replace(self, kind: Kind, body: Body, *, status: bool, checked: bool = True) -> Body:
        meta = body["metadata"]
        key = self._key(kind, meta["name"], meta.get("namespace"))
        current = self._existing(kind, meta["name"], meta.get("namespace"))
        if checked:
            # The API's optimistic concurrency: the version written on must be the stored one.
            if not meta.get("resourceVersion"):
                raise Invalid(422, "Invalid", f"{kind.kind} {meta['name']}: metadata.resourceVersion must be set")
            if meta["resourceVersion"] != current["metadata"]["resourceVersion"]:
                raise Conflict(409, "Conflict", f"{kind.kind} {meta['name']}: the object has been modified")
            if meta.get("uid") and meta["uid"] != current["metadata"]["uid"]:
                raise Conflict(409, "Conflict", f"{kind.kind} {meta['name']}: Precondition failed: UID")
        if status:  # the status subresource writes status only
            updated = {**copy.deepcopy(current), "status": copy.deepcopy(body.get("status"))}
        else:  # the object's PUT leaves status and what the server owns alone
            kept = {
                k: current["metadata"][k]
                for k in ("uid", "creationTimestamp", "deletionTimestamp")
                if k in current["metadata"]
            }
            updated = {**copy.deepcopy(body), "metadata": {**copy.deepcopy(meta), **kept}}
            if "status" in current:
                updated["status"] = copy.deepcopy(current["status"])
            else:
                updated.pop("status", None)
        updated["metadata"]["resourceVersion"] = str(self._now())
        if updated["metadata"].get("deletionTimestamp") and not updated["metadata"].get("finalizers"):
            del self._objects[key]  # the last finalizer of a deleting object dropped: it is gone
            self._gone(key, updated)
        else:
            self._objects[key] = updated
            self._record("MODIFIED", kind.plural, updated)
        return copy.deepcopy(updated)

    def _delete(
        self, kind: Kind, name: str, namespace: str | None, uid: str | None, resource_version: str | None
    ) -> bool:
        key = self._key(kind, name, namespace)
        current = self._objects.get(key)
        if current is None:
            return False  # as the adapter says it: gone already
        meta = current["metadata"]
        if (uid and uid != meta["uid"]) or (resource_version and resource_version != meta["resourceVersion"]):
            raise Conflict(409, "Conflict", f"{kind.kind} {name}: Precondition failed")
        if meta.get("finalizers"):  # held until the last finalizer goes
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = dt.datetime.now(dt.UTC).isoformat()
                meta["resourceVersion"] = str(self._now())
                self._record("MODIFIED", kind.plural, current)
            return True
        del self._objects[key]
        self._gone(key, current)
        return True


def _merge(target: Any, patch: Any) -> Any:
    """JSON merge patch (RFC 7386)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        else:
            target[k] = _merge(target.get(k), v)
    return target
