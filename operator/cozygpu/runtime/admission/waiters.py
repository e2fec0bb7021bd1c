"""Wake-ups for admissions waiting on the binder, by the devices each waits for.

The VMI webhook waits for its answer on the watch (through the view), never by polling
the API: a change of one of its own devices wakes it to re-check (`changed`, subscribed
to GPUDevice changes by the Operator); changes of other devices, and of every other kind
(a VMI's status, a node's heartbeat), wake no waiting admission.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from cozygpu.state.cluster import Change, DeviceKey


class Waiters:
    def __init__(self) -> None:
        self._by_device: dict[DeviceKey, set[asyncio.Event]] = {}

    def changed(self, change: Change) -> None:
        for event in self._by_device.get(change.key, ()):
            event.set()

    @contextmanager
    def waiting(self, devices: Iterable[DeviceKey]) -> Iterator[asyncio.Event]:
        """An event set whenever one of these devices changes in the view, for as long as the block runs."""
        event, keys = asyncio.Event(), set(devices)
        for key in keys:
            self._by_device.setdefault(key, set()).add(event)
        try:
            yield event
        finally:
            for key in keys:
                events = self._by_device[key]
                events.discard(event)
                if not events:
                    del self._by_device[key]
