"""One watch stream of one kind, read in a thread of its own (`kube.adapter` starts and ends it).

Its lines are JSON events; `close` ends the stream from another thread at once.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pykube
import requests

from cozygpu.api.kinds import Kind
from cozygpu.kube.errors import error_of

Body = dict[str, Any]


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
            "GET", version=self._kind.api_version, url=self._kind.plural, params=self._params,
            stream=True, timeout=(10, self._timeout + 30),
        )  # fmt: skip
        self._response = response
        try:
            if not response.ok:
                raise error_of(response, f"{self._kind.kind}s")
            for line in response.iter_lines():
                if self._closed:
                    return
                if line:
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
