"""The no-bypass policy's parameter (§12.3) kept by its worker, and each class's readiness, against the in-memory
API.

ManagedResources keeps one ConfigMap listing every GPUClass's resourceName: it creates it,
follows the classes, puts it back when someone deletes it, and writes nothing that is already
there (issue 20 item 7). While the policy is in force, a class is Ready only once the API server refused a probe
for its resource and no pod admitted before waits for the scheduler; the in-memory API stands in for the policy's
refusal here (tests/integration/test_class_readiness.py has the real API server refuse it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any

import pytest

from cozygpu.api import kinds
from cozygpu.api.names import CONDITION_READY
from cozygpu.kube.adapter import ApiError
from cozygpu.runtime.admission import guard as guard_module
from cozygpu.runtime.admission.guard import CONFIG_MAP, ManagedResources
from cozygpu.runtime.admission.policy import MANAGED_RESOURCES, NAME, PROBE_GUARDED, RESOURCES_KEY
from cozygpu.runtime.view import View
from tests.support.memkube import MemKube
from tests.support.views import A10, L40S, gpu_class
from tests.support.workers import SHORT, run_until
from tests.support.writing import writer as writer_with

OPS = "cozy-gpu"
HOUR = 3600.0  # an interval no test waits for: what happens comes from the class changes


def _guard(
    *classes: dict[str, Any],
    interval: float = HOUR,
    guarded: bool = False,
    unplaced: list[str] | None = None,
) -> tuple[ManagedResources, View, MemKube]:
    writer, view, kube = writer_with()
    settled.clear()
    scheduled.clear()
    for c in classes:
        view.apply(kinds.GPU_CLASS, kube.put(kinds.GPU_CLASS, c))

    async def settle(resources: Collection[str]) -> dict[str, frozenset[str]]:
        settled.append(sorted(resources))
        return {key: frozenset(resources) for key in unplaced or []}

    async def placed(key: str) -> bool:
        return key in scheduled

    guard = ManagedResources(
        view.cluster,
        kube,
        writer,
        OPS,
        interval=interval,
        guarded=guarded,
        settle=settle,
        placed=placed,
    )
    view.subscribe(guard.changed, kinds.GPU_CLASS)
    return guard, view, kube


settled: list[list[str]] = []
scheduled: set[str] = set()  # the followed pods the scheduler has placed


def _refused_by_policy(resource: str) -> ApiError:
    """What the API server answers a probe once its policy guards `resource`."""
    return ApiError(
        403,
        "Forbidden",
        f"configmaps is forbidden: ValidatingAdmissionPolicy '{NAME}' with binding '{NAME}' denied request: "
        f"probe: {resource} {PROBE_GUARDED}",
    )


def _ready(view: View, name: str) -> tuple[str, str] | None:
    cls = view.cluster.classes.get(name)
    condition = next((c for c in cls.status.conditions if c.type == CONDITION_READY), None) if cls else None
    return None if condition is None else (condition.status.value, condition.reason)


def test_a_class_is_ready_only_once_a_probe_for_its_resource_is_refused() -> None:
    """The first probe is allowed (the API server's copy lags): the class says it waits; the next is refused, and
    the class is Ready for its generation, after the pods were settled for its resource."""
    settled.clear()
    guard, view, kube = _guard(gpu_class("a10"), guarded=True)
    seen: list[tuple[str, str] | None] = []

    def ready() -> bool:
        now = _ready(view, "a10")
        if now not in seen:
            seen.append(now)
            if now == ("False", "AwaitingGuard"):
                kube.fail_next(_refused_by_policy(A10), method="create")
        return now == ("True", "Guarded")

    assert asyncio.run(run_until(guard.run, ready))
    assert seen == [None, ("False", "AwaitingGuard"), ("True", "Guarded")]
    assert settled == [[A10]]
    cls = view.cluster.classes["a10"]
    assert cls.ready() and kube.stored(CONFIG_MAP, MANAGED_RESOURCES, OPS) is not None


def test_a_class_waits_for_pods_admitted_before_its_guard_to_be_scheduled() -> None:
    """The probe is refused, but a pod asking for the resource was admitted before and is not on a node yet: the
    class is not Ready, and its condition names the pod."""
    guard, view, kube = _guard(gpu_class("a10"), guarded=True, unplaced=["lab/early"])
    armed: list[bool] = []

    def waiting() -> bool:
        if not armed and _published(kube) is not None:  # the parameter is written: the next create is a probe
            kube.fail_next(_refused_by_policy(A10), method="create")
            armed.append(True)
        return _ready(view, "a10") == ("False", "AwaitingPods")

    assert asyncio.run(run_until(guard.run, waiting))
    cls = view.cluster.classes["a10"]
    assert not cls.ready()
    assert "lab/early" in cls.status.conditions[-1].message
    scheduled.add("lab/early")
    assert asyncio.run(run_until(guard.run, lambda: _ready(view, "a10") == ("True", "Guarded")))
    assert settled[-1] == [A10]  # one look at every pod, not one per pass


def test_a_pod_kept_unschedulable_keeps_a_class_waiting_no_longer_than_the_patience(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tenant's pod asking for the resource, admitted before the guard and kept unschedulable, is followed but
    cannot keep the class unready past PATIENCE."""
    monkeypatch.setattr(guard_module, "PATIENCE", 0.3)
    guard, view, kube = _guard(gpu_class("a10"), guarded=True, unplaced=["mallory/forever"])
    armed: list[bool] = []

    def ready() -> bool:
        if not armed and _published(kube) is not None:
            kube.fail_next(_refused_by_policy(A10), method="create")
            armed.append(True)
        return _ready(view, "a10") == ("True", "Guarded")

    assert asyncio.run(run_until(guard.run, ready))
    assert list(guard._following) == ["mallory/forever"]  # still read again, one by one, until placed or gone


def test_a_pod_waited_for_holds_back_only_the_classes_of_its_resource() -> None:
    """One resource's unscheduled pod does not keep a class of another resource waiting."""
    guard, view, kube = _guard(gpu_class("a10"), guarded=True)

    async def settle(resources: Collection[str]) -> dict[str, frozenset[str]]:
        return {"lab/early": frozenset({A10})} if A10 in resources else {}

    guard._settle = settle
    refusals: list[str] = []

    def states() -> bool:
        if not refusals and _published(kube) is not None:
            kube.fail_next(_refused_by_policy(A10), method="create")
            refusals.append(A10)
        elif refusals == [A10] and _ready(view, "a10") == ("False", "AwaitingPods"):
            view.apply(kinds.GPU_CLASS, kube.put(kinds.GPU_CLASS, gpu_class("l40s", L40S)))
            refusals.append(L40S)
        elif refusals == [A10, L40S] and kube.count("replace") > 0 and L40S in (_published(kube) or ""):
            kube.fail_next(_refused_by_policy(L40S), method="create")
            refusals.append("armed")
        return _ready(view, "l40s") == ("True", "Guarded")

    assert asyncio.run(run_until(guard.run, states))
    assert _ready(view, "a10") == ("False", "AwaitingPods")


def test_without_the_policy_no_class_is_probed_nor_marked() -> None:
    """Policy off (noBypassPolicy.enabled false, or no webhooks): nothing waits on a guard that never comes."""
    guard, view, kube = _guard(gpu_class("a10"), guarded=False)
    assert not asyncio.run(run_until(guard.run, lambda: _ready(view, "a10") is not None, within=SHORT))
    assert kube.count("create") == 1  # the parameter only


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


def test_a_parameter_the_api_server_does_not_take_up_is_named_with_its_remedy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Probes still allowed long after the parameter named the resource: the API server stopped following it (the
    binding was gone a moment, kubernetes/kubernetes#130887); the class says so, and what to do."""
    monkeypatch.setattr(guard_module, "STALE_AFTER", 0.3)
    guard, view, _ = _guard(gpu_class("a10"), guarded=True)

    def named() -> bool:
        cls = view.cluster.classes["a10"]
        return any("restart the API servers" in c.message for c in cls.status.conditions)

    assert asyncio.run(run_until(guard.run, named))
    assert _ready(view, "a10") == ("False", "AwaitingGuard")
