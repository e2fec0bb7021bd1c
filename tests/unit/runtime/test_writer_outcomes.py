"""The one writer's one outcome (issue 20 item 4): landed, conflict read into the view, gone.

Against tests.support.memkube, an in-memory API with the real resourceVersion rules; the
real API server's tier is tests/integration/test_writer.py.
"""

from __future__ import annotations

import asyncio

from cozygpu.api import kinds
from cozygpu.runtime.writes import State
from tests.support.writing import NS, device, seen, with_status, writer


def _phase(view_device: object) -> object:
    return getattr(getattr(view_device, "status", None), "phase", None)


# -- landed ---------------------------------------------------------------------


def test_a_write_that_lands_answers_with_the_apis_body_and_the_view_holds_it() -> None:
    """LANDED: the body is the API's answer (its new resourceVersion), and the view stores exactly that."""
    w, view, kube = writer()
    stored = seen(view, kube, device())
    outcome = asyncio.run(w.replace_status(kinds.GPU_DEVICE, with_status(stored, phase="Pending")))
    assert outcome.state is State.LANDED and outcome.written and outcome.body is not None
    assert outcome.body == kube.stored(kinds.GPU_DEVICE, "d", NS)
    held = view.cluster.devices.get((NS, "d"))
    assert held is not None and held.metadata.resource_version == outcome.body["metadata"]["resourceVersion"]
    assert _phase(held) == "Pending"


def test_a_create_that_lands_is_in_the_view_with_its_uid() -> None:
    """LANDED for a create: the API's uid and version reach the view without waiting for the watch."""
    w, view, _ = writer()
    outcome = asyncio.run(w.create(kinds.GPU_DEVICE, device()))
    assert outcome.state is State.LANDED and outcome.body is not None
    held = view.cluster.devices.get((NS, "d"))
    assert held is not None and held.metadata.uid == outcome.body["metadata"]["uid"]


def test_a_delete_of_an_object_without_finalizers_at_once_leaves_the_view() -> None:
    """LANDED with `at_once`: the view forgets the object now, not when the watch says so."""
    w, view, kube = writer()
    stored = seen(view, kube, device())
    outcome = asyncio.run(w.delete(kinds.GPU_DEVICE, "d", NS, uid=stored["metadata"]["uid"], at_once=True))
    assert outcome.state is State.LANDED
    assert view.cluster.devices.get((NS, "d")) is None and kube.stored(kinds.GPU_DEVICE, "d", NS) is None


def test_a_delete_held_by_a_finalizer_leaves_the_view_to_the_watch() -> None:
    """LANDED without `at_once`: the object stays (deletion pending, §6.5), so the view keeps it."""
    w, view, kube = writer()
    seen(view, kube, device(finalizers=["gpu.cozystack.io/in-use"]))
    assert asyncio.run(w.delete(kinds.GPU_DEVICE, "d", NS)).state is State.LANDED
    assert view.cluster.devices.get((NS, "d")) is not None
    pending = kube.stored(kinds.GPU_DEVICE, "d", NS)
    assert pending is not None and pending["metadata"]["deletionTimestamp"]


# -- conflict: someone wrote first ----------------------------------------------


def test_a_stale_write_is_a_conflict_whose_body_is_one_fresh_read_now_in_the_view() -> None:
    """CONFLICT: the writer reads once, the view takes the winner's version, the caller gets it (no second GET)."""
    w, view, kube = writer()
    stored = seen(view, kube, device())
    winner = asyncio.run(kube.replace_status(kinds.GPU_DEVICE, with_status(stored, phase="Bound", nodeName="n1")))
    gets = kube.count("get")
    outcome = asyncio.run(w.replace_status(kinds.GPU_DEVICE, with_status(stored, phase="Pending")))
    assert outcome.state is State.CONFLICT and not outcome.written
    assert outcome.body == winner
    assert kube.count("get") == gets + 1
    held = view.cluster.devices.get((NS, "d"))
    assert held is not None and held.metadata.resource_version == winner["metadata"]["resourceVersion"]


def test_a_create_of_a_taken_name_is_a_conflict_with_the_object_there() -> None:
    """CONFLICT for a create: the object of the name is the body and is in the view (the accountant adopts it)."""
    w, view, kube = writer()
    there = kube.put(kinds.GPU_DEVICE, device())
    outcome = asyncio.run(w.create(kinds.GPU_DEVICE, device()))
    assert outcome.state is State.CONFLICT and outcome.body is not None
    assert outcome.body["metadata"]["uid"] == there["metadata"]["uid"]
    held = view.cluster.devices.get((NS, "d"))
    assert held is not None and held.metadata.uid == there["metadata"]["uid"]


def test_a_delete_whose_precondition_fails_is_a_conflict_with_the_fresh_object() -> None:
    """CONFLICT for a delete under a stale resourceVersion: nothing deleted, the newer version read into the view."""
    w, view, kube = writer()
    stored = seen(view, kube, device())
    newer = asyncio.run(kube.replace_status(kinds.GPU_DEVICE, with_status(stored, phase="Pending")))
    outcome = asyncio.run(
        w.delete(
            kinds.GPU_DEVICE,
            "d",
            NS,
            uid=stored["metadata"]["uid"],
            resource_version=stored["metadata"]["resourceVersion"],
        )
    )
    assert outcome.state is State.CONFLICT and outcome.body == newer
    assert kube.stored(kinds.GPU_DEVICE, "d", NS) is not None
    held = view.cluster.devices.get((NS, "d"))
    assert held is not None and held.metadata.resource_version == newer["metadata"]["resourceVersion"]


# -- gone -----------------------------------------------------------------------


def test_a_write_to_an_object_deleted_meanwhile_is_gone_and_forgotten() -> None:
    """GONE: the API has no object of the name, so the view forgets the one it held."""
    w, view, kube = writer()
    stored = seen(view, kube, device())
    asyncio.run(kube.delete(kinds.GPU_DEVICE, "d", NS))
    outcome = asyncio.run(w.replace_status(kinds.GPU_DEVICE, with_status(stored, phase="Pending")))
    assert outcome.state is State.GONE and outcome.body is None
    assert view.cluster.devices.get((NS, "d")) is None


def test_a_delete_of_an_object_already_gone_is_gone_and_forgotten() -> None:
    """GONE for a delete (the view missed the deletion in a watch gap): the view forgets it."""
    w, view, kube = writer()
    seen(view, kube, device())
    asyncio.run(kube.delete(kinds.GPU_DEVICE, "d", NS))
    assert asyncio.run(w.delete(kinds.GPU_DEVICE, "d", NS)).state is State.GONE
    assert view.cluster.devices.get((NS, "d")) is None


def test_a_read_finds_the_current_object_and_puts_it_in_the_view() -> None:
    """CURRENT: a fresh read (the webhook's, §3.3) reaches the view, which had not heard of the object."""
    w, view, kube = writer()
    there = kube.put(kinds.GPU_DEVICE, device())
    outcome = asyncio.run(w.read(kinds.GPU_DEVICE, "d", NS))
    assert outcome.state is State.CURRENT and outcome.body == there
    assert view.cluster.devices.get((NS, "d")) is not None


def test_a_read_of_a_name_never_held_leaves_no_tombstone_behind() -> None:
    """GONE for a name the view never held buries nothing: the bounded tombstones keep the real removals."""
    w, view, kube = writer(tombstones=1)
    old = seen(view, kube, device("old"))
    view.forget(kinds.GPU_DEVICE, NS, "old", str(int(old["metadata"]["resourceVersion"]) + 1))
    assert asyncio.run(w.read(kinds.GPU_DEVICE, "never", NS)).state is State.GONE
    view.apply(kinds.GPU_DEVICE, old)  # a late echo of the removed object
    assert view.cluster.devices.get((NS, "old")) is None


# -- the one read-decide-write loop (issue 35 item 3) ----------------------------------------------------------


def test_update_decides_again_on_what_another_writer_wrote_first() -> None:
    """A write made on a stale version conflicts; `update` decides again on the fresh read the CONFLICT carries,
    and its second write lands on top of the other writer's."""
    w, view, kube = writer()
    stale = seen(view, kube, device())
    kube.change(kinds.GPU_DEVICE, with_status(stale, phase="Pending"), status=True)  # someone wrote first
    seen_versions: list[str] = []

    async def decide(body: dict[str, object] | None) -> object:
        assert body is not None
        seen_versions.append(body["metadata"]["resourceVersion"])  # type: ignore[index]
        return lambda: w.replace_status(kinds.GPU_DEVICE, with_status(body, message="mine"))

    outcome = asyncio.run(w.update(stale, decide))  # type: ignore[arg-type]
    assert outcome.written and len(seen_versions) == 2 and seen_versions[0] != seen_versions[1]
    status = (kube.stored(kinds.GPU_DEVICE, "d", NS) or {})["status"]
    assert (status["phase"], status["message"]) == ("Pending", "mine")


def test_update_writes_nothing_when_nothing_is_left_to_write_and_gives_up_after_its_tries() -> None:
    """CURRENT when `decide` has nothing to write; the last CONFLICT when another writer always wins."""
    w, view, kube = writer()
    stored = seen(view, kube, device())

    async def nothing(body: dict[str, object] | None) -> None:
        return None

    assert asyncio.run(w.update(stored, nothing)).state is State.CURRENT
    calls = []

    async def always_stale(body: dict[str, object] | None) -> object:
        calls.append(body)
        return lambda: w.replace_status(kinds.GPU_DEVICE, with_status(stored, message="late"))  # the first version

    kube.change(kinds.GPU_DEVICE, with_status(stored, phase="Pending"), status=True)
    outcome = asyncio.run(w.update(stored, always_stale, tries=3))  # type: ignore[arg-type]
    assert outcome.state is State.CONFLICT and len(calls) == 3
