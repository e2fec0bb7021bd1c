"""How many evacuations (§6.8) may be under way at once: off each node, and in the whole cluster.

Callers: the binder's mover (idle devices leaving a cordoned node) and its evacuator (VMs restarting off one)
share one `Pacing`, like KubeVirt's `parallelOutboundMigrationsPerNode` and `parallelMigrationsPerCluster`,
so a drain moves its node's VMs and devices a few at a time, the first marked first.
"""

from __future__ import annotations

from collections.abc import Hashable


class Pacing:
    def __init__(self, per_node: int, total: int) -> None:
        self._per_node = per_node
        self._total = total
        self._under_way: dict[Hashable, str] = {}  # what is under way, with the node it leaves
        self._off: dict[str, int] = {}
        self._stopping: set[Hashable] = set()  # under way off their node only: their guests stopping

    def room(self, node: str) -> int:
        """How many more may start off the node now (the cluster's limit included)."""
        return max(0, min(self._per_node - self._off.get(node, 0), self.left()))

    def left(self) -> int:
        return max(0, self._total - len(self._under_way) + len(self._stopping))

    def start(self, key: Hashable, node: str) -> None:
        if key not in self._under_way:
            self._under_way[key] = node
            self._off[node] = self._off.get(node, 0) + 1

    def stopping(self, key: Hashable) -> None:
        """`key`'s own steps are done and only its guest is still stopping (a VMI deleted, its launcher in its grace
        period, which the tenant sets): it keeps its node's place, not the cluster's, so one tenant's guests slow
        to stop hold back their own nodes' drains only."""
        if key in self._under_way:
            self._stopping.add(key)

    def done(self, key: Hashable) -> bool:
        """`key` is no longer under way; whether it was."""
        self._stopping.discard(key)
        node = self._under_way.pop(key, None)
        if node is None:
            return False
        self._off[node] -= 1
        if not self._off[node]:
            del self._off[node]
        return True

    def __contains__(self, key: Hashable) -> bool:
        return key in self._under_way

    def __len__(self) -> int:
        return len(self._under_way)
