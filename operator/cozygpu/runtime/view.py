"""The one door into the cluster view: everything that changes it comes through here.

Watch events and lists (runtime.watching.informer, runtime.watching.podwatch, the resync too), the responses
of our own writes and fresh reads (runtime.writes), and the binder's decisions in flight
(`assume`, `settle`, through the writer) all go through `View`, the only holder of the cluster's
write side (`state.indexers`; tests/unit/test_layout.py holds every other module to the read side,
`state.cluster`). A stored change goes to every worker that subscribed to its kind;
workers keep their own queues from those changes, and nothing in the view is another
worker's to-do list.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cozygpu.api import GPUDevice
from cozygpu.api.kinds import Kind
from cozygpu.state.cluster import KINDS, Assumption, Change, Cluster
from cozygpu.state.indexers import Indexers

Subscriber = Callable[[Change], None]


class View:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._indexers = Indexers(cluster)
        self._subscribers: dict[Kind, list[Subscriber]] = {kind: [] for kind in KINDS}

    def subscribe(self, subscriber: Subscriber, *kinds: Kind) -> None:
        """Call `subscriber` with every change of these kinds that the view stored (every kind if none)."""
        for kind in kinds or KINDS:
            self._subscribers[kind].append(subscriber)

    def apply(self, kind: Kind, body: dict[str, Any], *, deleted: bool = False) -> Change:
        change = self._indexers.apply(kind, body, deleted=deleted)
        if change.stored:
            for subscriber in self._subscribers[kind]:
                subscriber(change)
        return change

    def forget(self, kind: Kind, namespace: str, name: str, resource_version: str | None = None) -> Change:
        """The API says the object is gone (a NotFound, a list that lacks it)."""
        meta = {"namespace": namespace, "name": name, "resourceVersion": resource_version}
        return self.apply(kind, {"metadata": meta}, deleted=True)

    def progressed(self, kind: Kind, resource_version: str) -> None:
        """The informer of `kind` has applied every event through this version (a list's, a watch event's)."""
        if resource_version:
            self._indexers.progressed(kind, resource_version)

    def assume(self, device: GPUDevice) -> Assumption:
        """Count the binder's decision before its write returns (§13.1); the write's answer, or a fresh read, is
        what the workers hear of it (through `apply`), after `settle`."""
        return self._indexers.assume(device)

    def settle(self, namespace: str, name: str, token: int) -> bool:
        """The write of assumption `token` is done or failed: the API's answer counts from now on."""
        return self._indexers.settle(namespace, name, token)
