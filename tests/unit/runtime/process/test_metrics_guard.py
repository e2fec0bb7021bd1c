"""Who may read /metrics (§14.4) under a stream of made-up tokens: the scraper allowed before is checked again in
a slot of its own and its answer is kept apart, so the stream can neither evict it nor keep it out (issue 34
item 6). The in-memory API answers the two reviews: a token is valid and allowed when it starts with "good"."""

from __future__ import annotations

import asyncio
from typing import Any

from cozygpu.runtime.process.metrics_auth import MetricsGuard
from tests.support.memkube import MemKube

Body = dict[str, Any]


def _reviewing(kube: MemKube, stalled: asyncio.Event) -> None:
    """TokenReview and SubjectAccessReview answered as the API server would for these tokens; a made-up token's
    review waits on `stalled` (an API server slow to answer a flood)."""

    async def create(kind: Any, body: Body, **_: Any) -> Body:
        if body["kind"] == "TokenReview":
            token = body["spec"]["token"]
            if not token.startswith("good"):
                await stalled.wait()
                return {**body, "status": {"authenticated": False}}
            return {**body, "status": {"authenticated": True, "user": {"username": "prometheus"}}}
        return {**body, "status": {"allowed": body["spec"]["user"] == "prometheus"}}

    kube.create = create  # type: ignore[method-assign]


def test_a_stream_of_made_up_tokens_keeps_neither_the_scrapers_answer_nor_its_check_out() -> None:
    """The scraper is allowed; then made-up tokens fill the table of answers past its size and two of them hold
    both shared checks; the scraper's answer runs out, and its next scrape is checked and allowed. Before, its
    answer was evicted and its check answered 503 while the stream lasted."""
    kube = MemKube()
    stalled = asyncio.Event()
    _reviewing(kube, stalled)

    async def scenario() -> tuple[int, int, int]:
        guard = MetricsGuard(kube, remembered=8, keep_for=0.2)
        first = (await guard.check("Bearer good-scraper")).status
        stalled.set()
        for i in range(20):  # answered at once: 401, each kept, evicting older answers
            await guard.check(f"Bearer made-up-{i}")
        stalled.clear()
        held = [asyncio.create_task(guard.check(f"Bearer stalled-{i}")) for i in range(2)]
        await asyncio.sleep(0.3)  # both shared checks under way; the scraper's answer has run out
        busy = (await guard.check("Bearer made-up-other")).status
        again = (await guard.check("Bearer good-scraper")).status
        stalled.set()
        await asyncio.gather(*held)
        return first, busy, again

    assert asyncio.run(scenario()) == (200, 503, 200)
