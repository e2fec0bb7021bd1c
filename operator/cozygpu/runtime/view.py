"""The one door into the cluster view: everything that changes it comes through here.

Watch events and lists (runtime.informer, for the resync too) and the responses of
our own writes (runtime.writes) all go through `View.apply`, which
stores them in the `Cluster` and hands the resulting `Change` to every worker that
subscribed to its kind. Workers keep their own queues from those changes; nothing in
the view is another worker's to-do list.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cozygpu.state.cluster import KINDS, Change, Cluster

Subscriber = Callable[[Change], None]


class View:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._subscribers: dict[str, list[Subscriber]] = {kind: [] for kind in KINDS}

    def subscribe(self, subscriber: Subscriber, *kinds: str) -> None:
        """Call `subscriber` with every change of these kinds that the view stored (every kind if none)."""
        for kind in kinds or KINDS:
            self._subscribers[kind].append(subscriber)

    def apply(self, kind: str, body: dict[str, Any], *, deleted: bool = False) -> Change:
        change = self.cluster.apply(kind, body, deleted=deleted)
        if change.stored:
            for subscriber in self._subscribers[kind]:
                subscriber(change)
        return change

    def forget(self, kind: str, namespace: str, name: str, resource_version: str | None = None) -> Change:
        """The API says the object is gone (a NotFound, a list that lacks it)."""
        meta = {"namespace": namespace, "name": name, "resourceVersion": resource_version}
        return self.apply(kind, {"metadata": meta}, deleted=True)
