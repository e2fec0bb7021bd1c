"""kopf keeps nothing per object a review names (§14.1): not for the devices ever updated, nor for made-up uids."""

from __future__ import annotations

import asyncio

from kopf._core.reactor.inventory import ResourceMemories

from cozygpu.runtime.process import handlers
from cozygpu.settings import Settings


async def review_many(memories: ResourceMemories, count: int) -> None:
    """What kopf's admission does per UPDATE or DELETE review: recall the object's memo, not ephemeral."""
    for i in range(count):
        body = {"metadata": {"uid": f"made-up-{i}", "name": f"d{i}", "namespace": "t1"}}
        await memories.recall_memo(body, ephemeral=False)


def test_reviews_with_fresh_uids_leave_kopfs_memory_empty() -> None:
    """1,000 UPDATE reviews, each naming a fresh uid, and the memory kopf runs with holds none of them; kopf's own
    memory would hold all 1,000 for the process's life (it forgets only on a watch's deletion event)."""
    memories = handlers.kopf_options(Settings.load({}, {}))["memories"]
    asyncio.run(review_many(memories, 1000))
    assert list(memories.iter_all_memories()) == []
    kopfs_own = ResourceMemories()
    asyncio.run(review_many(kopfs_own, 1000))
    assert len(list(kopfs_own.iter_all_memories())) == 1000  # what the operator ran with before
