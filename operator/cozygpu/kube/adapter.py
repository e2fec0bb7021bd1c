"""pykube-ng behind one small surface: get, list, watch, create, replace, patch, delete.

Callers: the dev control plane and test helpers (synchronously, `Kube`) and the
operator's executors (typed against the protocol `AsyncKube`; `ThreadedKube` runs each
call in a worker thread, and a watch streams in a thread of its own). API failures come
out as `ApiError` subclasses that say which object and why.

Why one module: the calls, their async protocol and its threaded form are one surface,
spelled once per call; the import contract that only the adapter talks to pykube names it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import threading
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any, ParamSpec, Protocol, TypeVar

import pykube
import pykube.http
import requests

from cozygpu.api import kinds as known
from cozygpu.api.kinds import Kind
from cozygpu.kube.errors import AlreadyExists, ApiError, Conflict, Forbidden, Invalid, NotFound, error_of
from cozygpu.kube.http import client, settled
from cozygpu.kube.watch import Watch, selectors

# The one surface: callers import the errors and the watch from here.
__all__ = ["AlreadyExists", "ApiError", "AsyncKube", "Body", "Conflict", "Forbidden", "Invalid", "Kube", "NotFound"]
__all__ += ["Watch"]

Body = dict[str, Any]

P = ParamSpec("P")
R = TypeVar("R")


def _describe(kind: Kind, name: str | None, namespace: str | None) -> str:
    where = f"{namespace}/" if namespace else ""
    return f"{kind.kind} {where}{name}" if name else f"{kind.kind}s"


class Kube:
    """Synchronous API access through pykube's authenticated HTTP client."""

    def __init__(self, api: pykube.HTTPClient) -> None:
        self._api = api

    @classmethod
    def from_kubeconfig(cls, path: str | Path, timeout: float = 30.0, connections: int = 10) -> Kube:
        return cls(client(pykube.KubeConfig.from_file(str(path)), timeout, connections))

    @classmethod
    def in_cluster(cls, timeout: float = 30.0, connections: int = 10) -> Kube:
        return cls(client(pykube.KubeConfig.from_service_account(), timeout, connections))

    def impersonating(self, user: str, extra: Mapping[str, str] | None = None) -> Kube:
        """A client with the same credentials acting as `user`, with extra user info (RBAC's `impersonate`).

        The dev tools play node agents this way: virt-handler's writes carry the node they come from."""
        api = settled(pykube.HTTPClient(self._api.config, timeout=self._api.timeout))
        api.session.headers["Impersonate-User"] = user
        for key, value in (extra or {}).items():
            api.session.headers[f"Impersonate-Extra-{urllib.parse.quote(key, safe='')}"] = value
        return Kube(api)

    def _call(
        self,
        method: str,
        kind: Kind,
        *,
        name: str | None = None,
        namespace: str | None = None,
        subresource: str | None = None,
        params: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        about: str | None = None,
    ) -> Body:
        path = "/".join(p for p in (kind.plural, name, subresource) if p)
        kwargs: dict[str, Any] = {"version": kind.api_version, "url": path}
        if kind.namespaced and namespace:
            kwargs["namespace"] = namespace
        if params:
            kwargs["params"] = params
        if body is not None:
            kwargs["data"] = json.dumps(body)
            kwargs["headers"] = {"Content-Type": content_type}
        response = self._api.request(method, **kwargs)
        if not response.ok:
            raise error_of(response, _describe(kind, name or about, namespace))
        result: Body = response.json()
        return result

    def get(self, kind: Kind, name: str, namespace: str | None = None) -> Body:
        return self._call("GET", kind, name=name, namespace=namespace)

    def get_or_none(self, kind: Kind, name: str, namespace: str | None = None) -> Body | None:
        try:
            return self.get(kind, name, namespace)
        except NotFound:
            return None

    def list_versioned(
        self, kind: Kind, namespace: str | None = None, label_selector: str | None = None
    ) -> tuple[list[Body], str]:
        """The items and the list's resourceVersion: the point in time the list shows."""
        params = {"labelSelector": label_selector} if label_selector else None
        answer = self._call("GET", kind, namespace=namespace, params=params)
        return answer["items"], str(answer.get("metadata", {}).get("resourceVersion", ""))

    def list_page(
        self, kind: Kind, limit: int, after: str = "", *, label_selector: str = "", field_selector: str = ""
    ) -> tuple[list[Body], str, str]:
        """One page of a list across namespaces: its items, the list's resourceVersion (every page of one
        list shows the same point in time) and the token for the next page, empty after the last."""
        params = {"limit": str(limit), **({"continue": after} if after else {})}
        params.update(selectors(label_selector, field_selector))
        answer = self._call("GET", kind, params=params)
        meta = answer.get("metadata", {})
        return answer["items"], str(meta.get("resourceVersion", "")), str(meta.get("continue") or "")

    def watch(
        self,
        kind: Kind,
        resource_version: str,
        *,
        label_selector: str = "",
        field_selector: str = "",
        timeout: int = 240,
    ) -> Watch:
        """The events of `kind` across namespaces after `resource_version`, until the server ends the stream
        (after about `timeout` seconds) or `Watch.close`. Bookmarks are asked for, so the version to resume
        from stays fresh on a quiet stream; a 410 arrives as an ERROR event whose object is a Status."""
        params = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout),
            **selectors(label_selector, field_selector),
        }
        # A session of its own: a stream held for minutes must not take one of the callers' connections.
        api = settled(pykube.HTTPClient(self._api.config, timeout=self._api.timeout))
        return Watch(api, kind, params, timeout)

    def list(self, kind: Kind, namespace: str | None = None, label_selector: str | None = None) -> list[Body]:
        return self.list_versioned(kind, namespace, label_selector)[0]

    def create(self, kind: Kind, body: Body, *, dry_run: bool = False) -> Body:
        namespace = body.get("metadata", {}).get("namespace")
        params = {"dryRun": "All"} if dry_run else None
        about = body.get("metadata", {}).get("name")
        return self._call("POST", kind, namespace=namespace, body=body, params=params, about=about)

    def replace(self, kind: Kind, body: Body, *, subresource: str | None = None, dry_run: bool = False) -> Body:
        """PUT: fails with Conflict when body's resourceVersion is not the stored one."""
        meta = body["metadata"]
        params = {"dryRun": "All"} if dry_run else None
        return self._call(
            "PUT",
            kind,
            name=meta["name"],
            namespace=meta.get("namespace"),
            subresource=subresource,
            body=body,
            params=params,
        )

    def replace_status(self, kind: Kind, body: Body) -> Body:
        return self.replace(kind, body, subresource="status")

    def patch(
        self,
        kind: Kind,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        patch_type: str = "merge",
    ) -> Body:
        content_type = {
            "merge": "application/merge-patch+json",
            "json": "application/json-patch+json",
            "strategic": "application/strategic-merge-patch+json",
        }[patch_type]
        return self._call(
            "PATCH",
            kind,
            name=name,
            namespace=namespace,
            subresource=subresource,
            body=patch,
            content_type=content_type,
        )

    def delete(
        self,
        kind: Kind,
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        propagation: str | None = None,
        grace_seconds: int | None = None,
    ) -> bool:
        """Delete; False when it was already gone. A uid or resourceVersion makes it a precondition
        (Conflict when it fails)."""
        options: Body = {"kind": "DeleteOptions", "apiVersion": "v1"}
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        if preconditions:
            options["preconditions"] = preconditions
        if propagation:
            options["propagationPolicy"] = propagation
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        try:
            self._call("DELETE", kind, name=name, namespace=namespace, body=options)
        except NotFound:
            return False
        return True

    def evict(self, name: str, namespace: str) -> str:
        """Ask the Eviction API to evict the pod, as `kubectl drain` does (PodDisruptionBudgets and admission webhooks,
        such as KubeVirt's for launchers, may refuse): "evicted", "gone" (no such pod), or the refusal's message when
        it is refused for now (429: try again, as drain does)."""
        eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        try:
            self._call("POST", known.POD, name=name, namespace=namespace, subresource="eviction", body=eviction)
        except NotFound:
            return "gone"
        except ApiError as e:
            if e.status == 429:
                return e.message
            raise
        return "evicted"

    def create_raw(self, kind: Kind, body: Body) -> requests.Response:
        """POST and hand back the response itself, for callers that read headers (warnings)."""
        kwargs: dict[str, Any] = {
            "version": kind.api_version,
            "url": kind.plural,
            "data": json.dumps(body),
            "headers": {"Content-Type": "application/json"},
        }
        namespace = body.get("metadata", {}).get("namespace")
        if kind.namespaced and namespace:
            kwargs["namespace"] = namespace
        response: requests.Response = self._api.request("POST", **kwargs)
        return response

    def request_token(self, namespace: str, service_account: str, seconds: int = 86_400) -> str:
        """A bound token for the ServiceAccount (TokenRequest), as the kubelet would mount one."""
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": seconds},
        }
        answer = self._call(
            "POST",
            known.kind("ServiceAccount"),
            name=service_account,
            namespace=namespace,
            subresource="token",
            body=request,
        )
        return str(answer["status"]["token"])

    def whoami(self) -> str:
        """The username the API server sees for this client (SelfSubjectReview)."""
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        answer = self._call("POST", known.kind("SelfSubjectReview"), body=review)
        return str(answer["status"]["userInfo"]["username"])

    def put_object(self, kind_: Kind, body: Body) -> Body:
        """Create, or replace what is there (for objects the operator alone owns)."""
        name = body["metadata"]["name"]
        current = self.get_or_none(kind_, name, body["metadata"].get("namespace"))
        if current is None:
            return self.create(kind_, body)
        updated = {**body, "metadata": {**body["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
        return self.replace(kind_, updated)

    def raw_get(self, path: str) -> requests.Response:
        """GET a non-resource path such as /readyz; the caller reads the response."""
        response: requests.Response = self._api.session.get(self._api.url + path, timeout=self._api.timeout)
        return response


_END = object()


class AsyncKube(Protocol):
    """The API as the operator's async code calls it: what its workers, webhooks, informers and writer are given.

    `ThreadedKube` is the real one; the unit tests' in-memory API (tests/support/memkube.py) is another, checked
    against this protocol by mypy."""

    async def get(self, kind: Kind, name: str, namespace: str | None = None) -> Body: ...

    async def get_or_none(self, kind: Kind, name: str, namespace: str | None = None) -> Body | None: ...

    async def create(self, kind: Kind, body: Body, *, dry_run: bool = False) -> Body: ...

    async def replace_status(self, kind: Kind, body: Body) -> Body: ...

    async def replace(self, kind: Kind, body: Body) -> Body: ...

    async def patch(
        self,
        kind: Kind,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        patch_type: str = "merge",
    ) -> Body: ...

    async def delete(
        self,
        kind: Kind,
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> bool: ...

    async def list_versioned(self, kind: Kind) -> tuple[list[Body], str]: ...

    async def list_page(
        self, kind: Kind, limit: int, after: str = "", *, label_selector: str = "", field_selector: str = ""
    ) -> tuple[list[Body], str, str]: ...

    def watch(
        self,
        kind: Kind,
        resource_version: str,
        *,
        label_selector: str = "",
        field_selector: str = "",
        timeout: int = 240,
    ) -> AsyncIterator[tuple[str, Body]]: ...

    async def list(self, kind: Kind, namespace: str | None = None) -> list[Body]: ...

    async def put_object(self, kind: Kind, body: Body) -> Body: ...

    def close(self) -> None: ...


class ThreadedKube:
    """`AsyncKube` over `Kube`: the same calls, each run in a worker thread of its own pool.

    The pool bounds how many API calls are in flight at once (asyncio's default executor would
    allow min(32, cores + 4)); the client keeps as many connections open, so each call reuses one."""

    def __init__(self, kube: Kube, workers: int = 8) -> None:
        self.sync = kube
        self.workers = workers
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="kube")

    async def _run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        call = functools.partial(fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def get(self, kind: Kind, name: str, namespace: str | None = None) -> Body:
        return await self._run(self.sync.get, kind, name, namespace)

    async def get_or_none(self, kind: Kind, name: str, namespace: str | None = None) -> Body | None:
        return await self._run(self.sync.get_or_none, kind, name, namespace)

    async def create(self, kind: Kind, body: Body, *, dry_run: bool = False) -> Body:
        return await self._run(self.sync.create, kind, body, dry_run=dry_run)

    async def replace_status(self, kind: Kind, body: Body) -> Body:
        return await self._run(self.sync.replace_status, kind, body)

    async def replace(self, kind: Kind, body: Body) -> Body:
        return await self._run(self.sync.replace, kind, body)

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
        return await self._run(
            self.sync.patch, kind, name, patch, namespace, subresource=subresource, patch_type=patch_type
        )

    async def delete(
        self,
        kind: Kind,
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> bool:
        return await self._run(self.sync.delete, kind, name, namespace, uid=uid, resource_version=resource_version)

    async def list_versioned(self, kind: Kind) -> tuple[list[Body], str]:
        return await self._run(self.sync.list_versioned, kind)

    async def list_page(
        self, kind: Kind, limit: int, after: str = "", *, label_selector: str = "", field_selector: str = ""
    ) -> tuple[list[Body], str, str]:
        return await self._run(
            self.sync.list_page, kind, limit, after, label_selector=label_selector, field_selector=field_selector
        )

    async def watch(
        self,
        kind: Kind,
        resource_version: str,
        *,
        label_selector: str = "",
        field_selector: str = "",
        timeout: int = 240,
    ) -> AsyncIterator[tuple[str, Body]]:
        """`Kube.watch`, its stream read in a thread of its own (not the pool's: it is held for minutes), its
        events handed to the event loop in order. Leaving the iteration closes the stream."""
        stream = self.sync.watch(
            kind, resource_version, label_selector=label_selector, field_selector=field_selector, timeout=timeout
        )
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()

        def hand(item: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                stream.close()

        def pump() -> None:
            try:
                for event in stream:
                    hand(event)
                hand(_END)
            except BaseException as e:  # handed to the reader, who raises it
                hand(e)

        threading.Thread(target=pump, name=f"watch-{kind.plural}", daemon=True).start()
        try:
            while True:
                item = await queue.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stream.close()

    async def list(self, kind: Kind, namespace: str | None = None) -> list[Body]:
        return await self._run(self.sync.list, kind, namespace)

    async def whoami(self) -> str:
        return await self._run(self.sync.whoami)

    async def put_object(self, kind: Kind, body: Body) -> Body:
        return await self._run(self.sync.put_object, kind, body)
