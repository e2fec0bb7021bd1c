"""The webhook port's door (§14.1): which connections may start TLS, and how many at once.

asyncio's TLS server runs each caller's key exchange on the event loop before the client certificate is checked,
so a pod that reaches the port could keep a replica's loop busy with handshakes it never means to finish, or
open connections until the process has no descriptors left. Here a connection is accepted as plain TCP and let
into TLS only
- while its peer address has fewer than `peer_connections` open (the next is closed at once, before any TLS);
- after its peer's backoff: a caller whose handshakes fail (no certificate the client CA signed, or none at all)
  waits twice as long after each failure, up to `BACKOFF_MOST`; a handshake that succeeds forgets them;
- in a turn (`Handshakes`): at most `handshakes` key exchanges at once on the replica; a peer whose last handshake
  succeeded (the API server) goes first and has a slot no other may take, the rest are handed round robin by peer
  address, so a peer with many queued delays another's by at most one of its own;
- within `handshake_within` for the key exchange, and `wait_within` for the backoff and the turn before it.
The TLS connection then goes to aiohttp's request handler, as its own TCP site would hand it over.

Callers: runtime.admission.webhooks.ReviewServer serves through a Doorway.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import structlog

log = structlog.get_logger("cozygpu.webhook")

# A first failed handshake delays its peer's next by this much, doubling per failure up to BACKOFF_MOST.
BACKOFF_FIRST = 0.05
BACKOFF_MOST = 5.0
# Peers with no connection open (remembered for a backoff, or as known) are forgotten when there are this many.
REMEMBERED = 4096


@dataclass(frozen=True)
class Limits:
    """What one replica lets each peer address do on the webhook port (settings: webhook_peer_connections,
    webhook_handshakes)."""

    # The API server opens a connection per call under way: up to its mutating in-flight limit (200 by default).
    peer_connections: int = 512
    handshakes: int = 4
    handshake_within: float = 3.0
    wait_within: float = 10.0


@dataclass
class _Peer:
    open: int = 0
    failures: int = 0
    not_before: float = 0.0
    known: bool = False  # its last handshake succeeded: a caller with a certificate (the API server)


class Handshakes:
    """A replica's key-exchange slots. A known peer (its last handshake succeeded: the API server, once it has
    connected) goes first, and one slot is for known peers alone; the rest are handed round robin by peer address.
    So peers whose handshakes stall or fail hold all slots but one, and never delay a known peer's turn; among
    themselves, a peer with many queued delays another by one of its own."""

    def __init__(self, slots: int) -> None:
        self._slots = slots
        self._busy = 0
        self._unknown_busy = 0  # slots held by peers not known
        self._known: deque[asyncio.Future[None]] = deque()
        # Unknown peers' waiting turns; the dict's order is the turn: a peer served goes to the back.
        self._others: dict[str, deque[asyncio.Future[None]]] = {}

    @contextlib.asynccontextmanager
    async def turn(self, peer: str, *, known: bool) -> AsyncIterator[None]:
        """Hold a slot for one handshake of `peer`."""
        queued = self._known or (not known and self._others)
        if self._may(known) and not queued:
            self._take(known)
        else:
            handed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            (self._known if known else self._others.setdefault(peer, deque())).append(handed)
            try:
                await handed
            except asyncio.CancelledError:
                if handed.done() and not handed.cancelled():  # handed a slot, then cancelled: give it on
                    self._give_back(known)
                raise
        try:
            yield
        finally:
            self._give_back(known)

    def _may(self, known: bool) -> bool:
        return self._busy < self._slots and (known or self._unknown_busy < max(1, self._slots - 1))

    def _take(self, known: bool) -> None:
        self._busy += 1
        self._unknown_busy += not known

    def _give_back(self, known: bool) -> None:
        self._busy -= 1
        self._unknown_busy -= not known
        while self._known and self._may(True):
            if self._hand(self._known.popleft(), True):
                return
        while self._others and self._may(False):
            peer = next(iter(self._others))
            queue = self._others.pop(peer)
            handed = queue.popleft()
            if queue:
                self._others[peer] = queue  # to the back of the turn
            if self._hand(handed, False):
                return

    def _hand(self, handed: asyncio.Future[None], known: bool) -> bool:
        if handed.done():  # a cancelled waiter is passed over
            return False
        self._take(known)
        handed.set_result(None)
        return True


class Doorway(aiohttp.web.BaseSite):
    """A listening TCP site of an aiohttp runner whose connections start TLS only within `Limits`. `context` may
    be replaced while it serves (a renewed certificate): connections from then on use the new one.

    It accepts on a socket of its own and hands an accepted socket to asyncio's TLS (`connect_accepted_socket`)
    only once let in: nothing of the caller's is read before, so no byte of its handshake can go astray."""

    def __init__(
        self,
        runner: aiohttp.web.BaseRunner,
        host: str | None,
        port: int,
        context: ssl.SSLContext,
        limits: Limits,
        *,
        refused: Callable[[str], None] = lambda reason: None,
    ) -> None:
        super().__init__(runner)
        self._refused = refused  # told why, for each connection turned away (a metric's label)
        self.context = context
        self.limits = limits
        self._host, self._port = host, port
        self._peers: dict[str, _Peer] = {}
        self._turns = Handshakes(limits.handshakes)
        self._listener: socket.socket | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def name(self) -> str:
        return f"https://{self._host or '0.0.0.0'}:{self._port}"

    async def start(self) -> None:
        await super().start()
        listener = socket.create_server(
            (self._host or "", self._port), backlog=self._backlog, reuse_port=hasattr(socket, "SO_REUSEPORT")
        )
        listener.setblocking(False)
        self._listener = listener
        self._spawn(self._accept(listener))

    async def stop(self) -> None:
        await super().stop()
        if self._listener is not None:
            self._listener.close()
        for task in list(self._tasks):  # the accept loop, and connections not yet let in
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def peers(self) -> dict[str, int]:
        """Open connections per peer address (for tests and the debug log)."""
        return {address: peer.open for address, peer in self._peers.items() if peer.open}

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, peername = await loop.sock_accept(listener)
            except OSError as e:  # out of descriptors, a connection reset before it was taken: the next one
                log.warning("webhook.accept_failed", error=str(e))
                await asyncio.sleep(0.1)
                continue
            self._arrived(conn, str(peername[0]) if isinstance(peername, tuple) and peername else "?")

    def _arrived(self, conn: socket.socket, address: str) -> None:
        peer = self._peers.get(address)
        if peer is None:
            if len(self._peers) >= REMEMBERED:
                self._forget_ended()
            peer = self._peers[address] = _Peer()
        if peer.open >= self.limits.peer_connections:
            self._turn_away(address, "peer_connections")
            conn.close()
            return
        peer.open += 1
        self._spawn(self._let_in(conn, address, peer))

    async def _let_in(self, conn: socket.socket, address: str, peer: _Peer) -> None:
        let_in = False
        try:
            async with contextlib.AsyncExitStack() as turn:
                try:
                    async with asyncio.timeout(self.limits.wait_within):
                        await asyncio.sleep(max(0.0, peer.not_before - time.monotonic()))
                        await turn.enter_async_context(self._turns.turn(address, known=peer.known))
                except TimeoutError:
                    self._turn_away(address, "waited_too_long")
                    return
                handler = self._runner.server
                assert handler is not None
                door = _Door(self, address, handler())
                try:
                    await asyncio.get_running_loop().connect_accepted_socket(
                        lambda: door, conn, ssl=self.context, ssl_handshake_timeout=self.limits.handshake_within
                    )
                except (OSError, TimeoutError) as e:  # ssl.SSLError and ConnectionError are OSErrors
                    peer.failures += 1
                    peer.known = False
                    peer.not_before = time.monotonic() + min(BACKOFF_MOST, BACKOFF_FIRST * 2 ** (peer.failures - 1))
                    self._turn_away(address, "handshake_failed", failures=peer.failures, error=str(e))
                    return
                let_in = True  # from here its door counts it, until the connection is lost
            peer.failures, peer.not_before, peer.known = 0, 0.0, True
        finally:
            if not let_in:  # closed here (asyncio closed it already if TLS failed), no longer counted
                conn.close()
                self._left(address)

    def _turn_away(self, address: str, reason: str, **detail: object) -> None:
        log.debug("webhook.connection_refused", peer=address, reason=reason, **detail)
        self._refused(reason)

    def _left(self, address: str) -> None:
        peer = self._peers.get(address)
        if peer is None:
            return
        peer.open -= 1
        if not peer.open and not peer.failures and not peer.known:
            del self._peers[address]

    def _forget_ended(self) -> None:
        now = time.monotonic()
        for address in [a for a, p in self._peers.items() if not p.open and p.not_before <= now]:
            del self._peers[address]


class _Door(asyncio.Protocol):
    """One let-in connection's protocol: aiohttp's request handler behind it, kept in between so the connection's
    end is counted against its peer."""

    def __init__(self, doorway: Doorway, address: str, inner: asyncio.Protocol) -> None:
        self._doorway = doorway
        self.address = address
        self._inner = inner
        self._counted = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._counted:
            self._counted = False
            self._doorway._left(self.address)
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()
