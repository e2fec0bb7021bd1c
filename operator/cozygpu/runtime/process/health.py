"""/healthz, /readyz and /metrics over plain HTTP (§10): ready only once nothing decides on a partial view;
alive while no task the process needs has died (a blocked event loop answers nothing, which the probe's
timeout reads the same way). /metrics answers only callers the guard allows (§14.4, runtime.process.metrics_auth)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

Guard = Callable[[str | None], Awaitable[tuple[int, str]]]  # Authorization header -> (status, why)


class HealthServer:
    def __init__(
        self,
        host: str,
        port: int,
        ready: Callable[[], tuple[bool, str]],
        metrics: Callable[[], tuple[bytes, str]] | None = None,
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
        body, content_type = self._metrics()
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
