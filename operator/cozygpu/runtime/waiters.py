"""Wake-ups for admissions waiting on the binder: set whenever the view changes.

The VMI webhook waits for its answer on the watch (through the view), never by
polling the API: each change to a device notifies every waiter, which re-checks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager


class Waiters:
    def __init__(self) -> None:
        self._events: set[asyncio.Event] = set()

    def notify(self) -> None:
        for event in self._events:
            event.set()

    @contextmanager
    def waiting(self) -> Iterator[asyncio.Event]:
        event = asyncio.Event()
        self._events.add(event)
        try:
            yield event
        finally:
            self._events.discard(event)
