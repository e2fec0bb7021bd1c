"""Kubernetes Events (§10) are best effort, and shared fairly: one tenant's burst of failures drops its own Events,
not every tenant's (issue 34 item 6)."""

from __future__ import annotations

import asyncio
from typing import Any

from cozygpu.api import kinds
from cozygpu.runtime.events import Recorder
from tests.support.memkube import MemKube


def _ref(namespace: str, name: str) -> dict[str, Any]:
    device = {"apiVersion": "gpu.cozystack.io/v1alpha1", "kind": "GPUDevice", "name": name}
    return {**device, "namespace": namespace, "uid": f"u-{name}"}


def test_one_namespaces_burst_fills_only_its_share_of_the_queue() -> None:
    """Posting is stalled (an API server slow to create Events); mallory's 500 failures fill her share of a
    100-Event queue, and the victim's Event still waits its turn and is posted. Before, her burst filled the whole
    queue and the victim's Event was dropped."""
    kube = MemKube()
    release = asyncio.Event()
    plain = kube.create

    async def slow(kind: Any, body: dict[str, Any]) -> dict[str, Any]:
        await release.wait()
        return await plain(kind, body)

    kube.create = slow  # type: ignore[method-assign]

    async def scenario() -> tuple[int, list[str]]:
        recorder = Recorder(kube, posters=1, queued=100, share=10)
        for i in range(500):
            recorder.post_about(_ref("mallory", f"d{i}"), "Failed", "no node")
        recorder.post_about(_ref("victim", "mine"), "Bound", "bound on node n1")
        release.set()
        await recorder.close(grace=5.0)
        return recorder.dropped, [e["metadata"]["namespace"] for e in kube.stored_all(kinds.kind("Event"))]

    dropped, posted = asyncio.run(scenario())
    assert posted.count("victim") == 1
    assert posted.count("mallory") <= 11 and dropped >= 489  # her share, and one being posted when she began
