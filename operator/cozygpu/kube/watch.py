"""One watch stream of one kind, read in a thread of its own (`kube.adapter` starts and ends it).

Its lines are JSON events; `close` ends the stream from another thread at once. Lines are cut from the
stream's chunks in time linear in their size (`lines`): requests' `iter_lines` joins and splits again all
that is pending at every chunk, quadratic in a line's length, so one tenant's fat object cost every replica
seconds of CPU per event (issue 34 item 2).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator
from typing import Any

import pykube
import requests

from cozygpu.api.kinds import Kind
from cozygpu.kube.errors import error_of

Body = dict[str, Any]
# What one read of the stream asks for at most: the API server writes a watch in chunks (one or a few events
# each), and a read returns one as it arrives, never waiting for this many bytes.
CHUNK = 64 * 1024


def lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The newline-separated lines of a stream of chunks, each byte looked at and copied a bounded number of
    times; what follows the last newline is a last line, if any."""
    pending: list[bytes] = []
    for chunk in chunks:
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            pending.append(chunk[start:end])
            yield b"".join(pending)
            pending.clear()
            start = end + 1
        if start < len(chunk):
            pending.append(chunk[start:])
    if pending:
        yield b"".join(pending)


def selectors(label_selector: str, field_selector: str) -> dict[str, str]:
    return {
        **({"labelSelector": label_selector} if label_selector else {}),
        **({"fieldSelector": field_selector} if field_selector else {}),
    }


class Watch:
    """One watch stream: iterate for (type, object) pairs; `close` ends it from another thread."""

    def __init__(self, api: pykube.HTTPClient, kind: Kind, params: dict[str, str], timeout: int) -> None:
        self._api, self._kind, self._params, self._timeout = api, kind, params, timeout
        self._response: requests.Response | None = None
        self._closed = False

    def __iter__(self) -> Iterator[tuple[str, Body]]:
        response = self._api.request(
            "GET",
            version=self._kind.api_version,
            url=self._kind.plural,
            params=self._params,
            stream=True,
            timeout=(10, self._timeout + 30),
        )
        self._response = response
        try:
            if not response.ok:
                raise error_of(response, f"{self._kind.kind}s")
            for line in lines(response.iter_content(chunk_size=CHUNK)):
                if self._closed:
                    return
                if line.strip():
                    event = json.loads(line)
                    yield str(event.get("type", "")), event.get("object") or {}
        finally:
            response.close()
            self._api.session.close()

    def close(self) -> None:
        """End the stream now. Closing the response here would wait for the reading thread's lock (until the
        server next sends something); shutting the socket down wakes that thread, which closes it."""
        self._closed = True
        if self._response is not None:
            with contextlib.suppress(Exception):  # already released: the stream has ended anyway
                self._response.raw.shutdown()
