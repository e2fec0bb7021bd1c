"""Workers outlive their failures (§10): restarted with backoff, reported to /readyz meanwhile; a task that
really dies is reported by /healthz and ends the process."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from cozygpu.runtime.process import supervision
from cozygpu.runtime.process.health import HealthServer
from cozygpu.runtime.process.supervision import Supervisor


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


def test_a_task_that_dies_is_reported_dead_and_ends_the_process_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A task started without restarts that raises has died: `dead` names it and what it raised, and `on_death`
    is called once. A cancelled task, one that returned (leadership after a lost Lease) and a supervised
    worker that keeps failing are not deaths."""
    monkeypatch.setattr(supervision, "BACKOFF", (0.01, 0.01))
    deaths: list[str] = []
    supervisor = Supervisor(on_death=lambda: deaths.append("ended"))

    async def crashing() -> None:
        raise RuntimeError("renewal bug")

    async def silent() -> None:
        raise ConnectionError()

    async def returning() -> None:
        return None

    async def forever() -> None:
        await asyncio.sleep(3600)

    async def scenario() -> None:
        cancelled = supervisor.start("accountant", forever)
        failing = supervisor.start("collector", crashing)  # supervised: restarted, again and again
        returned = supervisor.start("leadership", returning, restart=False)
        for _ in range(1000):  # until the failing worker was started again twice, however slow the machine
            if supervisor.restarts >= 2:
                break
            await asyncio.sleep(0.01)
        cancelled.cancel()
        await asyncio.gather(cancelled, returned, return_exceptions=True)
        assert supervisor.dead() == {} and deaths == []
        assert supervisor.restarts >= 2 and not failing.done()
        failing.cancel()
        died = supervisor.start("leadership", crashing, restart=False)
        bare = supervisor.start("webhooks", silent, restart=False)
        await asyncio.gather(died, bare, failing, return_exceptions=True)
        await asyncio.sleep(0)

    asyncio.run(scenario())
    assert supervisor.dead() == {"leadership": "failed: renewal bug", "webhooks": "failed: ConnectionError"}
    assert deaths == ["ended"]


def test_healthz_answers_500_naming_the_dead_task_and_200_otherwise() -> None:
    """/healthz is what the kubelet restarts on: 500 with the task and how it died, 200 while none has."""
    alive: list[tuple[bool, str]] = [(True, "")]

    async def scenario() -> list[tuple[int, str]]:
        server = HealthServer("127.0.0.1", 0, lambda: (True, ""), alive=lambda: alive[0])
        await server.start()
        seen = []
        try:
            async with aiohttp.ClientSession() as session:
                for state in ((True, ""), (False, "leadership failed: renewal bug; the process is ending")):
                    alive[0] = state
                    async with session.get(f"http://127.0.0.1:{server.port}/healthz") as r:
                        seen.append((r.status, await r.text()))
        finally:
            await server.stop()
        return seen

    assert asyncio.run(scenario()) == [(200, "ok"), (500, "leadership failed: renewal bug; the process is ending")]
