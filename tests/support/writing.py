"""A writer over a fresh view and an in-memory API (tests.support.memkube), and the bodies it writes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cozygpu.api import kinds
from cozygpu.api.names import API_VERSION
from cozygpu.runtime.view import View
from cozygpu.runtime.writes import Writer
from cozygpu.state.cluster import Cluster
from tests.support.memkube import MemKube

Body = dict[str, Any]
NS = "t1"


def writer(
    *, tombstones: int | None = None, crash_at: int = 0, clock: Callable[[], float] | None = None
) -> tuple[Writer, View, MemKube]:
    """`clock`: the view's, for how long devices have been idle (§5.7); the real monotonic clock if None."""
    kube = MemKube()
    kw: dict[str, Any] = {"clock": clock} if clock is not None else {}
    view = View(Cluster(**kw) if tombstones is None else Cluster(tombstones, **kw))
    # MemKube answers the calls the writer makes; the real adapter is the integration tiers' (§11).
    return Writer(view, kube, crash_at=crash_at), view, kube


def device(name: str = "d", *, finalizers: list[str] | None = None) -> Body:
    meta: Body = {"name": name, "namespace": NS, **({"finalizers": finalizers} if finalizers else {})}
    return {"apiVersion": API_VERSION, "kind": "GPUDevice", "metadata": meta, "spec": {"className": "a10", "count": 1}}


def seen(view: View, kube: MemKube, body: Body) -> Body:
    """Create `body` in the API as someone else would, and let the view hear of it as a watch would."""
    stored = kube.put(kinds.GPU_DEVICE, body)
    view.apply(kinds.GPU_DEVICE, stored)
    return stored


def seen_with_status(view: View, kube: MemKube, body: Body) -> Body:
    """`seen` for a body as the views' helpers build it: its status written through the subresource, as the API
    takes it, and its resourceVersion the API's own."""
    status = body.pop("status", None)
    body["metadata"].pop("resourceVersion", None)
    stored = kube.put(kinds.GPU_DEVICE, body)
    if status:
        stored = kube.change(kinds.GPU_DEVICE, {**stored, "status": status}, status=True)
    view.apply(kinds.GPU_DEVICE, stored)
    return stored


def with_status(body: Body, **status: Any) -> Body:
    return {**body, "status": {**(body.get("status") or {}), **status}}
