"""Workers outlive their failures (§10): restarted with backoff, reported to /readyz meanwhile."""

from __future__ import annotations

import asyncio

import pytest

from cozygpu.runtime import supervision
from cozygpu.runtime.supervision import Supervisor


def test_a_worker_that_fails_is_started_again_and_says_so_meanwhile(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker raising a network error is run again after a backoff; while it waits, `failing` names it and
    what failed; once it runs again, nothing is failing. Cancelling it ends it for good."""
    monkeypatch.setattr(supervision, "BACKOFF", (0.05, 0.05))
    supervisor = Supervisor()
    runs: list[int] = []
    seen: list[dict[str, str]] = []

    async def worker() -> None:
        runs.append(len(runs))
        if len(runs) < 3:
            raise ConnectionError("the API server went away")
        await asyncio.sleep(3600)

    async def scenario() -> None:
        task = asyncio.create_task(supervisor.supervised("accountant", worker))
        await asyncio.sleep(0.01)
        seen.append(supervisor.failing())
        await asyncio.sleep(0.3)
        seen.append(supervisor.failing())
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()

    asyncio.run(scenario())
    assert len(runs) == 3 and supervisor.restarts == 2
    assert seen == [{"accountant": "the API server went away"}, {}]
