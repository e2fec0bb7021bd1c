"""The webhook port's door (§14.1, issue 34 item 6): a peer past its open connections is closed before TLS starts,
key exchanges run a few at once in turns by peer address, a peer whose handshakes fail waits ever longer for its
next, and a renewed certificate serves new connections without a gap.

A real TLS server on loopback, as the operator serves it; the peers are distinct loopback addresses (127.0.0.x).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from cozygpu import tls
from cozygpu.ports import free_port
from cozygpu.runtime.admission import doorway, webhooks

HANG = 30.0  # a hang detector: far above every bound under test
SERVER = "127.0.0.1"
MALLORY, APISERVER = "127.0.0.2", "127.0.0.3"


async def _allow(review: Any, **_: Any) -> dict[str, Any]:
    return {"response": {"uid": review["request"]["uid"], "allowed": True}}


class Port:
    """A served webhook port and what its callers need: the server's CA, and a client certificate."""

    def __init__(self, serving: webhooks.Serving, client: tls.KeyPair | None, directory: Path) -> None:
        self.serving = serving
        self.port = int(serving.url.rsplit(":", 1)[1])
        self.client = client
        self.directory = directory

    @property
    def door(self) -> doorway.Doorway:
        assert self.serving.server.doorway is not None
        return self.serving.server.doorway

    def context(self, ca: bytes | None = None, certified: bool = True) -> ssl.SSLContext:
        context = ssl.create_default_context(cadata=(ca or self.serving.ca_bundle).decode())
        if certified and self.client is not None:
            cert, key = self.directory / "client.crt", self.directory / "client.key"
            cert.write_bytes(self.client.cert_pem)
            key.write_bytes(self.client.key_pem)
            context.load_cert_chain(cert, key)
        return context

    async def raw(self, peer: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A TCP connection from `peer` that never starts TLS."""
        return await asyncio.open_connection(SERVER, self.port, local_addr=(peer, 0))

    async def tls(self, peer: str, **context: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A TLS connection from `peer`, its handshake done."""
        return await asyncio.open_connection(
            SERVER, self.port, ssl=self.context(**context), server_hostname=SERVER, local_addr=(peer, 0)
        )


Serve = Callable[..., Awaitable[Port]]


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Serve]:
    tasks: list[asyncio.Task[None]] = []

    async def start(client_ca: bool = False, file_check_interval: float = 60.0, **limits: Any) -> Port:
        authority = tls.Authority("callers") if client_ca else None
        serving = webhooks.dev_serving(
            SERVER,
            free_port(SERVER),
            authority.cert_pem if authority else None,
            limits=doorway.Limits(**limits),
        )
        serving.server.file_check_interval = file_check_interval
        listening = asyncio.Event()

        async def run() -> None:
            async for _ in serving.server(_allow):
                listening.set()

        tasks.append(asyncio.create_task(run()))
        await listening.wait()
        return Port(serving, authority.client("kube-apiserver") if authority else None, tmp_path)

    yield start
    for task in tasks:
        task.cancel()
    async with asyncio.timeout(HANG):
        await asyncio.gather(*tasks, return_exceptions=True)


async def _closed_by_server(reader: asyncio.StreamReader) -> bool:
    """Whether the server closed the connection (EOF or reset) rather than leaving it open."""
    try:
        async with asyncio.timeout(HANG):
            return await reader.read() == b""
    except ConnectionError:
        return True


async def _fail_handshake(port: Port, peer: str) -> None:
    """A TLS connection from `peer` without a client certificate, to its refusal (TLS 1.3 tells the client only
    on its first read)."""
    try:
        reader, writer = await port.tls(peer, certified=False)
        async with asyncio.timeout(HANG):
            await reader.read()
        writer.close()
    except (ssl.SSLError, ConnectionError):
        pass


async def _failed(port: Port, peer: str, times: int) -> None:
    """Until the door has counted `times` failed handshakes of `peer`."""
    async with asyncio.timeout(HANG):
        while (known := port.door._peers.get(peer)) is None or known.failures != times:
            await asyncio.sleep(0.01)


async def test_a_peer_past_its_open_connections_is_closed_before_tls_starts(serve: Serve) -> None:
    """The connection over a peer's cap is closed at once, with no key exchange; another peer is still served, and
    the peer is served again once one of its connections ended."""
    port = await serve(peer_connections=2, handshake_within=HANG)
    told: list[str] = []
    port.serving.server.refused = told.append
    held = [await port.raw(MALLORY) for _ in range(2)]
    reader, writer = await port.raw(MALLORY)
    assert await _closed_by_server(reader)
    writer.close()
    assert told == ["peer_connections"]
    _, other = await port.tls(APISERVER)
    other.close()
    assert port.door.peers().get(MALLORY) == 2
    held[0][1].close()
    async with asyncio.timeout(HANG):
        while port.door.peers().get(MALLORY) != 1:
            await asyncio.sleep(0.01)
    _, again = await port.tls(MALLORY)
    again.close()
    held[1][1].close()


async def test_a_peer_holding_every_handshake_slot_delays_anothers_by_one_turn(serve: Serve) -> None:
    """With one slot, a peer's stalled handshakes are taken in turns with another peer's: the other's handshake
    ends before the stalling peer's third connection is given up."""
    port = await serve(handshakes=1, handshake_within=0.5)
    stalled = [await port.raw(MALLORY) for _ in range(3)]
    await asyncio.sleep(0.05)  # all three have arrived and queued
    events: list[str] = []

    async def apiserver() -> None:
        _, writer = await port.tls(APISERVER)
        events.append("apiserver served")
        writer.close()

    async def third() -> None:
        await _closed_by_server(stalled[2][0])
        events.append("mallory's third given up")

    async with asyncio.timeout(HANG):
        await asyncio.gather(apiserver(), third())
    for _, writer in stalled:
        writer.close()
    assert events == ["apiserver served", "mallory's third given up"]


async def test_a_known_peer_is_not_kept_waiting_by_stalled_handshakes(serve: Serve) -> None:
    """The API server, known once a handshake of its succeeded, takes the slot kept for known peers: another peer's
    stalled key exchanges hold every other slot, and never delay it."""
    port = await serve(handshakes=2, handshake_within=HANG)
    _, first = await port.tls(APISERVER)
    first.close()
    stalled = [await port.raw(MALLORY) for _ in range(4)]
    await asyncio.sleep(0.05)  # all have arrived: one holds a slot, three queue
    async with asyncio.timeout(HANG / 2):
        _, again = await port.tls(APISERVER)
    again.close()
    assert port.door.peers().get(MALLORY) == 4  # none given up: the API server did not wait for them
    for _, writer in stalled:
        writer.close()


async def test_a_peer_whose_handshake_failed_waits_before_its_next(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    """§14.1 with a client CA: a caller without a certificate fails its handshake, and its next connection, even
    one with a certificate, waits out the backoff while another peer's is served at once."""
    monkeypatch.setattr(doorway, "BACKOFF_FIRST", HANG * 2)
    monkeypatch.setattr(doorway, "BACKOFF_MOST", HANG * 2)
    port = await serve(client_ca=True)
    await _fail_handshake(port, MALLORY)
    await _failed(port, MALLORY, 1)
    next_one = asyncio.create_task(port.tls(MALLORY))
    _, apiserver = await port.tls(APISERVER)
    apiserver.close()
    await asyncio.sleep(0.1)
    assert not next_one.done()
    next_one.cancel()


async def test_a_handshake_that_succeeds_forgets_the_peers_failures(serve: Serve) -> None:
    """A peer that failed once (a certificate rotating) is served after its short backoff, and is then known, its
    failures forgotten."""
    port = await serve(client_ca=True)
    await _fail_handshake(port, MALLORY)
    await _failed(port, MALLORY, 1)
    _, writer = await port.tls(MALLORY)
    writer.close()
    async with asyncio.timeout(HANG):  # the server's side ends a moment after the client's (TLS 1.3)
        while not (peer := port.door._peers[MALLORY]).known:
            await asyncio.sleep(0.01)
    assert (peer.failures, peer.not_before) == (0, 0.0)


async def test_a_renewed_certificate_serves_new_connections(serve: Serve) -> None:
    """The chart's Secret renewed (its files changed): new connections get the new certificate while the port
    keeps listening."""
    port = await serve(file_check_interval=0.05)
    authority = tls.Authority("renewed")
    leaf = authority.serving([SERVER, "localhost"])
    Path(str(port.serving.server.pkeyfile)).write_bytes(leaf.key_pem)
    Path(str(port.serving.server.certfile)).write_bytes(leaf.cert_pem)
    async with asyncio.timeout(HANG):
        while True:
            try:
                _, writer = await port.tls(APISERVER, ca=authority.cert_pem)
                break
            except ssl.SSLError:
                await asyncio.sleep(0.05)
    writer.close()
    with pytest.raises(ssl.SSLError):
        await port.tls(APISERVER)  # the old CA no longer verifies what is served
