"""The informer's list-then-watch (§6.4, §13) against the in-memory API's lists and watch streams.

Each test runs the informer's loop until the view agrees with the API, and checks how it got
there: which lists and watches it made, from which resourceVersion (issue 20 item 7).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cozygpu.api import kinds
from cozygpu.kube.adapter import ApiError
from cozygpu.runtime.view import View
from cozygpu.runtime.watching import informer as informer_module
from cozygpu.runtime.watching.informer import Informer
from cozygpu.state.cluster import Cluster
from tests.support.memkube import MemKube
from tests.support.views import node
from tests.support.workers import run_until
from tests.support.writing import NS, device

Body = dict[str, Any]


def _informer() -> tuple[Informer, View, MemKube]:
    kube, view = MemKube(), View(Cluster())
    return Informer(view, kube, kinds.GPU_DEVICE, timeout=240), view, kube


def _held(view: View, name: str) -> bool:
    return view.cluster.devices.get((NS, name)) is not None


def _watched_from(kube: MemKube) -> list[str]:
    """The resourceVersion of every watch the informer opened, in order."""
    return [version for method, _, version in kube.calls if method == "watch"]


def test_a_list_seeds_the_view_and_the_watch_carries_on_from_the_lists_version() -> None:
    """A device created between the list and the watch arrives by the watch; a deletion after it is forgotten."""
    informer, view, kube = _informer()
    listed = kube.put(kinds.GPU_DEVICE, device("d1"))["metadata"]["resourceVersion"]
    kube.before_next("watch", lambda: kube.put(kinds.GPU_DEVICE, device("d2")))
    removed: list[bool] = []

    def caught_up() -> bool:
        if not removed and _held(view, "d2"):
            kube.remove(kinds.GPU_DEVICE, "d1", NS)
            removed.append(True)
        return bool(removed) and not _held(view, "d1")

    assert asyncio.run(run_until(informer.run, caught_up))
    assert kube.count("list") == 1 and _watched_from(kube) == [listed]
    assert informer.failing is None


def test_a_bookmark_moves_the_version_a_dropped_stream_resumes_from_without_a_list() -> None:
    """The server ends the stream after a BOOKMARK: the next watch starts at the bookmark's version, unlisted."""
    informer, view, kube = _informer()
    kube.put(kinds.GPU_DEVICE, device("d1"))
    marked: list[str] = []

    def resumed() -> bool:
        if not marked and _held(view, "d1") and len(_watched_from(kube)) == 1:
            # Versions move on with changes of another kind; the device stream hears of them by a bookmark.
            marked.append(kube.put(kinds.NODE, node("n1", {}))["metadata"]["resourceVersion"])
            kube.bookmark(kinds.GPU_DEVICE)
        elif marked and len(_watched_from(kube)) == 1 and informer._at == marked[0]:  # the bookmark was read
            kube.end_watches()
        return len(_watched_from(kube)) == 2

    assert asyncio.run(run_until(informer.run, resumed))
    assert kube.count("list") == 1 and _watched_from(kube)[1] == marked[0]


def test_a_list_in_pages_seeds_every_object_and_an_unchanged_one_is_not_read_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pages of one: three calls seed three devices; a second list finds all three at their versions."""
    monkeypatch.setattr(informer_module, "PAGE", 1)
    informer, view, kube = _informer()
    for name in ("d1", "d2", "d3"):
        kube.put(kinds.GPU_DEVICE, device(name))
    assert asyncio.run(informer.list()) == (0, 0)
    assert kube.count("list") == 3 and all(_held(view, n) for n in ("d1", "d2", "d3"))
    assert asyncio.run(informer.list()) == (0, 3)


def test_a_deletion_missed_while_no_watch_ran_is_forgotten_at_the_next_list() -> None:
    """§6.4 `missing`: what the view holds at a version no newer than the list, and the list lacks, is forgotten."""
    informer, view, kube = _informer()
    kube.put(kinds.GPU_DEVICE, device("d1"))
    kube.put(kinds.GPU_DEVICE, device("d2"))
    assert asyncio.run(informer.list()) == (0, 0)
    assert _held(view, "d1") and _held(view, "d2")
    kube.remove(kinds.GPU_DEVICE, "d2", NS)  # no watch runs: no DELETED event reaches the view
    forgotten, unchanged = asyncio.run(informer.list())
    assert (forgotten, unchanged) == (1, 1)
    assert _held(view, "d1") and not _held(view, "d2")


def test_a_410_expired_watch_lists_anew_at_once_and_learns_what_the_lost_history_said(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stream drops, its history is compacted: the watch is Expired, the informer lists again, not backs off."""
    monkeypatch.setattr(informer_module, "BACKOFF", (3600.0, 3600.0))  # the error path would wait an hour
    informer, view, kube = _informer()
    kube.put(kinds.GPU_DEVICE, device("d1"))
    kube.put(kinds.GPU_DEVICE, device("d2"))
    dropped: list[bool] = []

    def relisted() -> bool:
        if not dropped and _held(view, "d2") and len(_watched_from(kube)) == 1:
            kube.remove(kinds.GPU_DEVICE, "d2", NS)
            kube.end_watches()  # the DELETED event is never delivered ...
            kube.compact()  # ... and the server no longer has it
            dropped.append(True)
        return bool(dropped) and not _held(view, "d2") and kube.count("list") == 2

    assert asyncio.run(run_until(informer.run, relisted))
    assert _held(view, "d1") and informer.failing is None


def test_a_watch_error_is_retried_with_a_fresh_list_and_failing_says_why_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The API refuses the watch: `failing` carries its message until the retry's list succeeds, then clears."""
    monkeypatch.setattr(informer_module, "BACKOFF", (0.01, 0.01))
    informer, view, kube = _informer()
    kube.put(kinds.GPU_DEVICE, device("d1"))
    failing_at_retry: list[str | None] = []

    async def scenario() -> bool:
        await informer.list()  # listed already: the loop opens the watch first
        kube.fail_next(ApiError(500, "InternalError", "etcd is away"), method="watch")

        def retried() -> None:
            failing_at_retry.append(informer.failing)
            kube.put(kinds.GPU_DEVICE, device("d2"))  # changed while the watch was down

        kube.before_next("list", retried)
        return await run_until(informer.run, lambda: _held(view, "d2") and len(_watched_from(kube)) == 2)

    assert asyncio.run(scenario())
    assert failing_at_retry == ["etcd is away"]
    assert informer.failing is None and kube.count("list") == 2
