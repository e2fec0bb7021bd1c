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
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

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
    be replaced while it serves (a renewed certificate): connections from then on use the new one."""

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
        self._waiting: set[asyncio.Task[None]] = set()

    @property
    def name(self) -> str:
        return f"https://{self._host or '0.0.0.0'}:{self._port}"

    async def start(self) -> None:
        await super().start()
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Door(self), self._host, self._port, backlog=self._backlog, reuse_address=True, reuse_port=True
        )

    async def stop(self) -> None:
        await super().stop()
        for task in list(self._waiting):  # connections not yet let in have no handler to close them
            task.cancel()
        await asyncio.gather(*self._waiting, return_exceptions=True)

    def peers(self) -> dict[str, int]:
        """Open connections per peer address (for tests and the debug log)."""
        return {address: peer.open for address, peer in self._peers.items() if peer.open}

    def _arrived(self, door: _Door, transport: asyncio.Transport) -> None:
        address = _address_of(transport)
        peer = self._peers.get(address)
        if peer is None:
            if len(self._peers) >= REMEMBERED:
                self._forget_ended()
            peer = self._peers[address] = _Peer()
        if peer.open >= self.limits.peer_connections:
            self._turn_away(address, "peer_connections")
            transport.abort()
            return
        peer.open += 1
        door.address = address
        task = asyncio.get_running_loop().create_task(self._let_in(door, transport, peer))
        self._waiting.add(task)
        task.add_done_callback(self._waiting.discard)

    async def _let_in(self, door: _Door, transport: asyncio.Transport, peer: _Peer) -> None:
        let_in = False
        try:
            async with contextlib.AsyncExitStack() as turn:
                try:
                    async with asyncio.timeout(self.limits.wait_within):
                        await asyncio.sleep(max(0.0, peer.not_before - time.monotonic()))
                        await turn.enter_async_context(self._turns.turn(door.address, known=peer.known))
                except TimeoutError:
                    self._turn_away(door.address, "waited_too_long")
                    return
                try:
                    tls = await asyncio.get_running_loop().start_tls(
                        transport,
                        door,
                        self.context,
                        server_side=True,
                        ssl_handshake_timeout=self.limits.handshake_within,
                    )
                except (OSError, TimeoutError) as e:  # ssl.SSLError and ConnectionError are OSErrors
                    peer.failures += 1
                    peer.known = False
                    peer.not_before = time.monotonic() + min(BACKOFF_MOST, BACKOFF_FIRST * 2 ** (peer.failures - 1))
                    self._turn_away(door.address, "handshake_failed", failures=peer.failures, error=str(e))
                    return
            if tls is None:  # the peer went away as its handshake ended
                return
            peer.failures, peer.not_before, peer.known = 0, 0.0, True
            handler = self._runner.server
            assert handler is not None
            door.hand_to(handler(), tls)
            let_in = True
        finally:
            if not let_in:
                transport.abort()
                door.leave()

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


def _address_of(transport: asyncio.BaseTransport) -> str:
    peername = transport.get_extra_info("peername")
    return str(peername[0]) if isinstance(peername, tuple) and peername else "?"


class _Door(asyncio.Protocol):
    """One connection's protocol: a closed door until let in, then the pass-through to aiohttp's handler (kept in
    between so the connection's end is counted against its peer)."""

    def __init__(self, doorway: Doorway) -> None:
        self._doorway = doorway
        self.address = ""
        self._inner: asyncio.Protocol | None = None
        self._early = bytearray()  # what TLS delivered between the handshake's end and the handover
        self._eof = False
        self._counted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()  # nothing is read before TLS starts; start_tls resumes reading
        self._doorway._arrived(self, transport)
        self._counted = bool(self.address)

    def hand_to(self, inner: asyncio.Protocol, transport: asyncio.Transport) -> None:
        self._inner = inner
        inner.connection_made(transport)
        if self._early:
            inner.data_received(bytes(self._early))
            self._early.clear()
        if self._eof:
            inner.eof_received()

    def leave(self) -> None:
        """This connection no longer counts against its peer (called once whichever way it ends)."""
        if self._counted:
            self._counted = False
            self._doorway._left(self.address)

    def connection_lost(self, exc: Exception | None) -> None:
        self.leave()
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)
        else:
            self._early += data

    def eof_received(self) -> bool | None:
        if self._inner is not None:
            return self._inner.eof_received()
        self._eof = True
        return True

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()
