"""The no-bypass policy's parameter (§12.3) kept by its worker, against the in-memory API.

ManagedResources keeps one ConfigMap listing every GPUClass's resourceName: it creates it,
follows the classes, puts it back when someone deletes it, and writes nothing that is already
there (issue 20 item 7).
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from cozygpu.api import kinds
from cozygpu.kube.adapter import ApiError, AsyncKube
from cozygpu.runtime.admission.guard import CONFIG_MAP, ManagedResources
from cozygpu.runtime.admission.policy import MANAGED_RESOURCES, RESOURCES_KEY
from cozygpu.runtime.view import View
from cozygpu.state.cluster import Cluster
from tests.support.memkube import MemKube
from tests.support.views import A10, L40S, gpu_class
from tests.support.workers import SHORT, run_until

OPS = "cozy-gpu"
HOUR = 3600.0  # an interval no test waits for: what happens comes from the class changes


def _guard(*classes: dict[str, Any], interval: float = HOUR) -> tuple[ManagedResources, View, MemKube]:
    kube, view = MemKube(), View(Cluster())
    for c in classes:
        view.apply(kinds.GPU_CLASS, c)
    guard = ManagedResources(view.cluster, cast(AsyncKube, kube), OPS, interval=interval)
    view.subscribe(guard.changed, kinds.GPU_CLASS)
    return guard, view, kube


def _published(kube: MemKube) -> str | None:
    body = kube.stored(CONFIG_MAP, MANAGED_RESOURCES, OPS)
    return None if body is None else (body.get("data") or {}).get(RESOURCES_KEY)


def test_the_parameter_is_created_when_missing_listing_every_classs_resource_once() -> None:
    """Three classes of two resources: one ConfigMap in the operator's namespace naming both, sorted."""
    guard, _, kube = _guard(gpu_class("a10"), gpu_class("a10-shared", A10), gpu_class("l40s", L40S))
    assert asyncio.run(run_until(guard.run, lambda: _published(kube) is not None))
    assert _published(kube) == f"{A10},{L40S}"
    assert kube.count("create") == 1


def test_the_parameter_follows_a_class_added_and_a_class_removed() -> None:
    """A class of a new resource adds it; the last class of a resource going removes it."""
    guard, view, kube = _guard(gpu_class("a10"))
    steps: list[str] = []

    def followed() -> bool:
        if not steps and _published(kube) == A10:
            view.apply(kinds.GPU_CLASS, gpu_class("l40s", L40S))
            steps.append("added")
        elif steps == ["added"] and _published(kube) == f"{A10},{L40S}":
            view.apply(kinds.GPU_CLASS, gpu_class("a10"), deleted=True)
            steps.append("removed")
        return steps == ["added", "removed"] and _published(kube) == L40S

    assert asyncio.run(run_until(guard.run, followed))
    assert kube.count("create") == 1 and kube.count("replace") == 2


def test_a_class_change_that_leaves_the_list_as_it_is_writes_nothing() -> None:
    """Another class of a resource already listed wakes the worker, and nothing is written."""
    guard, view, kube = _guard(gpu_class("a10"))

    async def scenario() -> bool:
        assert await run_until(guard.run, lambda: _published(kube) == A10)
        view.apply(kinds.GPU_CLASS, gpu_class("a10-shared", A10))
        return await run_until(guard.run, lambda: kube.count("replace") + kube.count("create") > 1, within=SHORT)

    assert not asyncio.run(scenario())
    assert _published(kube) == A10


def test_a_parameter_someone_deleted_is_put_back_at_the_next_interval() -> None:
    """The interval's look at the API finds it gone (the policy guards nothing meanwhile) and creates it again."""
    guard, _, kube = _guard(gpu_class("a10"), interval=0.05)
    removed: list[bool] = []

    def restored() -> bool:
        if not removed and _published(kube) == A10:
            kube.remove(CONFIG_MAP, MANAGED_RESOURCES, OPS)
            removed.append(True)
        return bool(removed) and _published(kube) == A10

    assert asyncio.run(run_until(guard.run, restored))
    assert kube.count("create") == 2


def test_a_write_the_api_refused_is_not_taken_as_written_and_is_made_at_the_next_wake() -> None:
    """The create fails; any class change after (even one that leaves the list alone) has it written."""
    guard, view, kube = _guard(gpu_class("a10"))
    kube.fail_next(ApiError(500, "InternalError", "etcd is away"), method="create")
    woken: list[bool] = []

    def written() -> bool:
        if not woken and kube.count("create") == 1:  # the refused one
            view.apply(kinds.GPU_CLASS, gpu_class("a10-shared", A10))
            woken.append(True)
        return _published(kube) == A10

    assert asyncio.run(run_until(guard.run, written))
    assert kube.count("create") == 2
