"""The in-memory API (tests.support.memkube) keeps the API's rules the writer's unit tests rely on (§11)."""

from __future__ import annotations

import asyncio

import pytest

from cozygpu.api import kinds
from cozygpu.kube.adapter import AlreadyExists, ApiError, Conflict, NotFound
from tests.support.memkube import MemKube
from tests.support.writing import NS, device, with_status


def test_every_write_moves_the_resource_version_forward_and_a_stale_one_conflicts() -> None:
    """Versions only grow; a write under an older one is a Conflict and changes nothing."""
    kube = MemKube()
    first = kube.put(kinds.GPU_DEVICE, device())
    second = asyncio.run(kube.replace_status(kinds.GPU_DEVICE, with_status(first, phase="Pending")))
    assert int(second["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])
    with pytest.raises(Conflict):
        asyncio.run(kube.replace_status(kinds.GPU_DEVICE, with_status(first, phase="Bound")))
    assert kube.stored(kinds.GPU_DEVICE, "d", NS) == second


def test_names_are_unique_and_missing_objects_are_not_found() -> None:
    """AlreadyExists on a taken name, NotFound on a write to none, and a delete of none says False."""
    kube = MemKube()
    kube.put(kinds.GPU_DEVICE, device())
    with pytest.raises(AlreadyExists):
        asyncio.run(kube.create(kinds.GPU_DEVICE, device()))
    with pytest.raises(NotFound):
        asyncio.run(
            kube.replace(
                kinds.GPU_DEVICE,
                {**device("other"), "metadata": {"name": "other", "namespace": NS, "resourceVersion": "1"}},
            )
        )
    assert asyncio.run(kube.delete(kinds.GPU_DEVICE, "other", NS)) is False


def test_a_finalizer_holds_a_deletion_until_it_is_dropped() -> None:
    """deletionTimestamp while a finalizer stays; the write that drops the last one removes the object."""
    kube = MemKube()
    kube.put(kinds.GPU_DEVICE, device(finalizers=["f"]))
    assert asyncio.run(kube.delete(kinds.GPU_DEVICE, "d", NS)) is True
    deleting = kube.stored(kinds.GPU_DEVICE, "d", NS)
    assert deleting is not None and deleting["metadata"]["deletionTimestamp"]
    dropped = {**deleting, "metadata": {**deleting["metadata"], "finalizers": []}}
    asyncio.run(kube.replace(kinds.GPU_DEVICE, dropped))
    assert kube.stored(kinds.GPU_DEVICE, "d", NS) is None


def test_a_delete_precondition_on_uid_or_version_conflicts() -> None:
    """Deleting under another uid or an old version fails and leaves the object."""
    kube = MemKube()
    body = kube.put(kinds.GPU_DEVICE, device())
    with pytest.raises(Conflict):
        asyncio.run(kube.delete(kinds.GPU_DEVICE, "d", NS, uid="someone-else"))
    asyncio.run(kube.replace_status(kinds.GPU_DEVICE, with_status(body, phase="Pending")))
    with pytest.raises(Conflict):
        asyncio.run(kube.delete(kinds.GPU_DEVICE, "d", NS, resource_version=body["metadata"]["resourceVersion"]))
    assert kube.stored(kinds.GPU_DEVICE, "d", NS) is not None


def test_an_injected_failure_hits_the_next_call_of_its_method_once_landed_or_not() -> None:
    """`fail_next`: the next call of the method raises; with `landed` its effect stays; the call after is normal."""
    kube = MemKube()
    failure = ApiError(503, "ServiceUnavailable", "down")
    kube.fail_next(failure, method="create", landed=True)
    assert asyncio.run(kube.get_or_none(kinds.GPU_DEVICE, "d", NS)) is None
    with pytest.raises(ApiError):
        asyncio.run(kube.create(kinds.GPU_DEVICE, device()))
    assert kube.stored(kinds.GPU_DEVICE, "d", NS) is not None
    assert asyncio.run(kube.create(kinds.GPU_DEVICE, device("e")))["metadata"]["name"] == "e"


def test_a_watch_delivers_every_change_after_its_version_and_an_expired_one_is_a_410() -> None:
    """ADDED, MODIFIED and DELETED after the version, in order; after a compaction, one ERROR event of code 410."""
    kube = MemKube()
    first = kube.put(kinds.GPU_DEVICE, device("a"))
    since = first["metadata"]["resourceVersion"]
    kube.put(kinds.GPU_DEVICE, device("b"))
    kube.change(kinds.GPU_DEVICE, with_status(first, phase="Pending"), status=True)
    kube.remove(kinds.GPU_DEVICE, "b", NS)

    async def events(version: str, count: int) -> list[tuple[str, str]]:
        seen: list[tuple[str, str]] = []
        async for event, body in kube.watch(kinds.GPU_DEVICE, version):
            seen.append((event, str(body.get("metadata", {}).get("name") or body.get("code"))))
            if len(seen) == count:
                break
        return seen

    assert asyncio.run(events(since, 3)) == [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]
    kube.compact()
    assert asyncio.run(events(since, 1)) == [("ERROR", "410")]


def test_a_list_comes_in_pages_at_the_newest_version() -> None:
    """Pages of `limit` items with a token for the next, empty after the last; every page names the newest version."""
    kube = MemKube()
    newest = ""
    for name in ("a", "b", "c"):
        newest = kube.put(kinds.GPU_DEVICE, device(name))["metadata"]["resourceVersion"]
    items, version, after = asyncio.run(kube.list_page(kinds.GPU_DEVICE, 2))
    assert [i["metadata"]["name"] for i in items] == ["a", "b"] and version == newest and after
    items, version, after = asyncio.run(kube.list_page(kinds.GPU_DEVICE, 2, after))
    assert [i["metadata"]["name"] for i in items] == ["c"] and version == newest and after == ""
