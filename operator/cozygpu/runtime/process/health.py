"""/healthz, /readyz and /metrics over plain HTTP (§10): ready only once nothing decides on a partial view;
alive while no task the process needs has died (a blocked event loop answers nothing, which the probe's
timeout reads the same way). /metrics answers only callers the guard allows (§14.4, runtime.process.metrics_auth).

What ready means is `readiness`, a rule over a `Replica` snapshot the Operator takes at each probe.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from aiohttp import web

Guard = Callable[[str | None], Awaitable[tuple[int, str]]]  # Authorization header -> (status, why)


@dataclass(frozen=True)
class Replica:
    """What readiness reads of a replica, at one moment."""

    stopping: bool  # draining before it stops
    synced: bool  # the cluster view has listed everything once
    serving: bool  # the webhook server accepts connections
    unregistered: bool  # dev mode, and its own webhook configurations are not registered yet
    stopped: Sequence[str] = ()  # tasks of the process that ended
    failing: Sequence[tuple[str, str]] = ()  # workers starting again, and why
    watches: Sequence[tuple[str, str]] = ()  # watches failing (the kind's plural), and why
    role: str = ""  # "leader", "standby, ..." (no leader election: "")


def readiness(replica: Replica) -> tuple[bool, str]:
    """Ready once the view has synced and the webhooks serve, leader or standby (§10): every synced replica
    serves admissions. The text says which role the replica has, or why it is not ready."""
    if replica.stopping:
        return False, "stopping: answering the admissions under way"
    if not replica.synced:
        return False, "the cluster view has not synced yet"
    if not replica.serving:
        return False, "the admission webhooks are not serving yet"
    if replica.unregistered:
        # Dev mode serves itself: ready means the API server calls it (its registration, as leader).
        return False, "the admission webhooks are not registered yet"
    for name in replica.stopped:
        return False, f"{name} stopped"
    for name, why in sorted(replica.failing):
        return False, f"{name} failed and is starting again: {why}"
    for kind, why in replica.watches:
        return False, f"the watch of {kind} is failing: {why}"
    return True, replica.role


class HealthServer:
    def __init__(
        self,
        host: str,
        port: int,
        ready: Callable[[], tuple[bool, str]],
        metrics: Callable[[], Awaitable[tuple[bytes, str]]] | None = None,
        alive: Callable[[], tuple[bool, str]] = lambda: (True, ""),
        *,
        guard: Guard | None = None,
    ) -> None:
        self._guard = guard
        self._host, self._port = host, port
        self._ready = ready
        self._alive = alive
        self._metrics = metrics
        self._runner: web.AppRunner | None = None
        self.port = port

    async def _healthz(self, request: web.Request) -> web.Response:
        ok, why = self._alive()
        return web.Response(text="ok" if ok else why, status=200 if ok else 500)

    async def _readyz(self, request: web.Request) -> web.Response:
        ok, why = self._ready()
        text = (f"ok: {why}" if why else "ok") if ok else why  # ready: the text says the role (§10)
        return web.Response(text=text, status=200 if ok else 503)

    async def _metrics_text(self, request: web.Request) -> web.Response:
        if self._metrics is None:
            raise web.HTTPNotFound()
        if self._guard is not None:
            status, why = await self._guard(request.headers.get("Authorization"))
            if status != 200:
                headers = {"WWW-Authenticate": 'Bearer realm="metrics"'} if status == 401 else None
                return web.Response(text=why, status=status, headers=headers)
        body, content_type = await self._metrics()
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics_text)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        server = site._server
        if server is not None and self._port == 0:
            sockets = getattr(server, "sockets", None) or []
            self.port = sockets[0].getsockname()[1] if sockets else 0

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
