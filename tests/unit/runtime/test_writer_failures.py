"""The one writer when the outcome is unknown (issue 20 item 4, §13.1): assumptions settled, or doubtful.

A binder's decision counts in the view before its write returns (`View.assume`);
whatever the write's outcome, what the API has afterwards settles it, and a read that
fails too keeps it counted until `Writer.recheck` reads again.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from cozygpu.api import GPUDevice, kinds
from cozygpu.kube.adapter import ApiError
from cozygpu.runtime import writes
from cozygpu.runtime.view import View
from cozygpu.runtime.writes import State
from tests.support.writing import NS, device, seen, with_status, writer


def _unavailable() -> ApiError:
    return ApiError(503, "ServiceUnavailable", "the API server is unavailable")


def _assume(view: View, body: dict[str, object]) -> tuple[GPUDevice, int]:
    decided = GPUDevice.from_wire(with_status(body, phase="Bound", nodeName="n1"))
    return decided, view.assume(decided).token


def test_a_write_that_landed_but_failed_to_answer_settles_the_assumption_on_the_fresh_read() -> None:
    """The write lands, the answer is lost: the writer reads, settles, and the view holds the API's version."""
    w, view, kube = writer()
    decided, token = _assume(view, seen(view, kube, device()))
    kube.fail_next(_unavailable(), method="replace_status", landed=True)
    with pytest.raises(ApiError):
        asyncio.run(w.replace_status(kinds.GPU_DEVICE, decided.wire(), assumption=token))
    assert not view.cluster.devices.assumed(NS, "d") and not w.doubtful
    held = view.cluster.devices.get((NS, "d"))
    api = kube.stored(kinds.GPU_DEVICE, "d", NS)
    assert held is not None and api is not None
    assert held.metadata.resource_version == api["metadata"]["resourceVersion"] and held.status.phase == "Bound"


def test_a_write_and_its_read_both_failing_keep_the_assumption_doubtful_until_recheck() -> None:
    """Nothing known: the decision stays counted (units not given twice); `recheck` reads and settles it."""
    w, view, kube = writer()
    decided, token = _assume(view, seen(view, kube, device()))
    kube.fail_next(_unavailable(), method="replace_status")
    kube.fail_next(_unavailable(), method="get")
    with pytest.raises(ApiError):
        asyncio.run(w.replace_status(kinds.GPU_DEVICE, decided.wire(), assumption=token))
    assert w.doubtful and view.cluster.devices.assumed(NS, "d")
    asyncio.run(w.recheck())
    assert not w.doubtful and not view.cluster.devices.assumed(NS, "d")
    held = view.cluster.devices.get((NS, "d"))
    assert held is not None and held.status.phase is None  # the write never landed: the API's version counts


def test_a_read_that_fails_under_an_assumption_answers_unknown() -> None:
    """UNKNOWN: the read for an assumption failed; no exception, the device is doubtful."""
    w, view, kube = writer()
    _, token = _assume(view, seen(view, kube, device()))
    kube.fail_next(_unavailable(), method="get")
    assert asyncio.run(w.read(kinds.GPU_DEVICE, "d", NS, assumption=token)).state is State.UNKNOWN
    assert w.doubtful and view.cluster.devices.assumed(NS, "d")


def test_a_conflict_settles_the_assumption_and_the_view_takes_the_winner() -> None:
    """Someone wrote first: the decision is dropped and the view holds their version (decided again later)."""
    w, view, kube = writer()
    stored = seen(view, kube, device())
    decided, token = _assume(view, stored)
    winner = asyncio.run(kube.replace_status(kinds.GPU_DEVICE, with_status(stored, phase="Pending")))
    outcome = asyncio.run(w.replace_status(kinds.GPU_DEVICE, decided.wire(), assumption=token))
    assert outcome.state is State.CONFLICT and not view.cluster.devices.assumed(NS, "d")
    held = view.cluster.devices.get((NS, "d"))
    assert held is not None and held.metadata.resource_version == winner["metadata"]["resourceVersion"]


def test_a_read_for_an_older_decision_leaves_a_newer_one_in_flight() -> None:
    """Another decision of ours is in flight on the device: a read for the older one neither settles nor stores."""
    w, view, kube = writer()
    stored = seen(view, kube, device())
    _, older = _assume(view, stored)
    decided, newer = _assume(view, stored)
    asyncio.run(w.read(kinds.GPU_DEVICE, "d", NS, assumption=older))
    assert view.cluster.devices.assumed(NS, "d")
    held = view.cluster.devices.get((NS, "d"))
    assert held is not None and held.status.phase == "Bound"
    asyncio.run(w.replace_status(kinds.GPU_DEVICE, decided.wire(), assumption=newer))
    assert not view.cluster.devices.assumed(NS, "d")


def test_an_unknown_outcome_without_an_assumption_is_raised_and_the_view_is_left_as_it_was() -> None:
    """No re-read for plain writes that failed: the caller hears the error, the view keeps what it had."""
    w, view, kube = writer()
    stored = seen(view, kube, device())
    kube.fail_next(_unavailable(), method="replace_status")
    with pytest.raises(ApiError):
        asyncio.run(w.replace_status(kinds.GPU_DEVICE, with_status(stored, phase="Pending")))
    held = view.cluster.devices.get((NS, "d"))
    assert held is not None and held.metadata.resource_version == stored["metadata"]["resourceVersion"]
    assert kube.count("get") == 0


def test_a_plain_read_that_fails_is_raised() -> None:
    """The webhook's fresh reads fail closed (an InternalError there), so the writer raises, not guesses."""
    w, _, kube = writer()
    kube.fail_next(_unavailable(), method="get")
    with pytest.raises(ApiError):
        asyncio.run(w.read(kinds.GPU_DEVICE, "d", NS))


def test_no_crash_is_injected_unless_asked() -> None:
    """crash_at=0 (production): any number of writes lands without ending the process."""
    w, _, _ = writer()
    for i in range(5):
        assert asyncio.run(w.create(kinds.GPU_DEVICE, device(f"d{i}"))).written


def test_the_injected_crash_ends_the_process_after_the_nth_write_lands_before_the_view_hears(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """tests/reliability's crash point: the second write is in the API but never reached the view."""
    ended: list[int] = []

    def end(status: int) -> None:
        ended.append(status)
        raise SystemExit(status)

    monkeypatch.setattr(os, "_exit", end)
    w, view, kube = writer(crash_at=2)
    asyncio.run(w.create(kinds.GPU_DEVICE, device("a")))
    with pytest.raises(SystemExit):
        asyncio.run(w.create(kinds.GPU_DEVICE, device("b")))
    assert ended == [writes.CRASHED]
    assert kube.stored(kinds.GPU_DEVICE, "b", NS) is not None and view.cluster.devices.get((NS, "b")) is None
