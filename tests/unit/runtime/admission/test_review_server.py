"""The webhook server's own bounds (§10, §14.1): a caller that sends half a review and stops gets 408 once the
API server would have given up, and holds neither the connection nor a replica's drain; a connection kept alive
is closed by the first answer after its life, so the API server's next call may reach another replica.

A real TLS server on loopback, as the operator serves it; the callers write raw HTTP to it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cozygpu.runtime.admission import webhooks
from cozygpu.runtime.admission.webhooks import VMI_HOOK

# The hang detectors below: far above the bound under test (0.2 s), far below aiohttp's own 60 s...
HANG = 30.0
# ...and its 10 s of reading on after an answer (its lingering close), which a closed connection skips.
LINGER = 5.0
LIFE = 0.5  # a connection's life under test (30 s by default)


async def _allow(review: Any, **_: Any) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": review["request"]["uid"], "allowed": True},
    }


class Served:
    def __init__(self, serving: webhooks.Serving) -> None:
        self.serving = serving
        self.port = int(serving.url.rsplit(":", 1)[1])
        self.context = ssl.create_default_context(cadata=serving.ca_bundle.decode())
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        listening = asyncio.Event()

        async def serve() -> None:
            async for _ in self.serving.server(_allow):
                listening.set()

        self._task = asyncio.create_task(serve())
        await listening.wait()

    async def stop(self) -> None:
        """As kopf stops it: its task cancelled, which waits for the handlers under way."""
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def send(self, head: bytes, body: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port, ssl=self.context)
        writer.write(head + body)
        await writer.drain()
        return reader, writer


def _head(length: int) -> bytes:
    return (
        f"POST /{VMI_HOOK} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def _review() -> bytes:
    gvr = {"group": "kubevirt.io", "version": "v1", "resource": "virtualmachineinstances"}
    vmi = {"metadata": {"name": "vm", "namespace": "tenant-a"}}
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "resource": gvr,
                "userInfo": {"username": "someone"},
                "operation": "CREATE",
                "namespace": "tenant-a",
                "object": vmi,
            },
        }
    ).encode()


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = Served(webhooks.dev_serving("127.0.0.1", port, read_within=0.2, connection_life=LIFE))
    await server.start()
    yield server
    async with asyncio.timeout(HANG):
        await server.stop()


async def test_a_body_that_stops_half_way_is_answered_408_and_the_connection_closed(served: Served) -> None:
    """The API server sends a review at once; a body still missing after its timeout gets 408 and no handler."""
    reader, writer = await served.send(_head(1000), b'{"apiVersion": ')
    async with asyncio.timeout(HANG):
        status = await reader.readline()
    async with asyncio.timeout(LINGER):
        rest = await reader.read()  # to the end: the server closed the connection, not reading on
    writer.close()
    assert status.split()[1] == b"408", status
    assert b"did not arrive in time" in rest


async def test_a_replica_stops_promptly_with_a_half_sent_body_under_way(served: Served) -> None:
    """A drain ends once the handlers under way end: a half-sent body holds it for the read bound, not 60 s."""
    _, writer = await served.send(_head(1000), b'{"apiVersion": ')
    await asyncio.sleep(0.05)  # the request is being read
    async with asyncio.timeout(HANG):
        await served.stop()
    writer.close()


async def test_a_whole_review_is_still_answered(served: Served) -> None:
    """The bound cuts slow bodies only: a review sent whole is answered as before."""
    body = _review()
    reader, writer = await served.send(_head(len(body)), body)
    async with asyncio.timeout(HANG):
        status = await reader.readline()
    writer.close()
    assert status.split()[1] == b"200", status


async def _answer(reader: asyncio.StreamReader) -> dict[str, str]:
    """One HTTP answer's status and headers, its body read too (by Content-Length)."""
    async with asyncio.timeout(HANG):
        status = (await reader.readline()).split()[1].decode()
        headers = {"status": status}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        await reader.readexactly(int(headers.get("content-length", "0")))
    return headers


async def test_a_kept_alive_connection_is_closed_by_the_first_answer_after_its_life(served: Served) -> None:
    """§10: reviews on one connection are answered and it is kept while young; the first answer after its life
    says `Connection: close` and the server closes it. Before, a connection served for as long as the caller kept
    it, so a replica that joined got no admissions (issue 33 item 3)."""
    body = _review()
    reader, writer = await served.send(_head(len(body)), body)
    young = await _answer(reader)
    writer.write(_head(len(body)) + body)
    await writer.drain()
    still = await _answer(reader)
    await asyncio.sleep(LIFE)
    writer.write(_head(len(body)) + body)
    await writer.drain()
    aged = await _answer(reader)
    async with asyncio.timeout(LINGER):
        rest = await reader.read()  # the end of the stream: the server closed it
    writer.close()
    assert (young["status"], still["status"], aged["status"]) == ("200", "200", "200")
    assert young.get("connection", "").lower() != "close" and still.get("connection", "").lower() != "close"
    assert aged.get("connection", "").lower() == "close" and rest == b""


async def test_a_new_connection_is_young_whatever_the_age_of_others(served: Served) -> None:
    """Each connection's life is its own: one opened after another aged is kept alive by its first answer."""
    body = _review()
    reader, writer = await served.send(_head(len(body)), body)
    await _answer(reader)
    await asyncio.sleep(LIFE)
    reader2, writer2 = await served.send(_head(len(body)), body)
    fresh = await _answer(reader2)
    writer.write(_head(len(body)) + body)
    await writer.drain()
    aged = await _answer(reader)
    writer.close()
    writer2.close()
    assert fresh.get("connection", "").lower() != "close" and aged.get("connection", "").lower() == "close"
