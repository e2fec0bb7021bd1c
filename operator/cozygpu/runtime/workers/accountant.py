"""The accountant (§1.3, §8.3, §1.4, §1.1): keeps GPUNode, GPUBudget and GPUClass status current.

Keeps its own queue of the nodes and namespaces the view's changes touched (`changed`),
computes status with
`decisions.nodestatus` and `decisions.usestatus`, and writes only what changed:
creating a GPUNode for a node that starts serving a class, deleting it when nothing
is left to say.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
from collections.abc import Callable

import structlog

from cozygpu.api import ConditionStatus, GPUNode, kinds
from cozygpu.api.gpubudget import GPUBudgetStatus
from cozygpu.api.meta import now as utcnow
from cozygpu.api.names import API_VERSION
from cozygpu.decisions.budgets import covering_budgets
from cozygpu.decisions.nodestatus import gpunode_status
from cozygpu.decisions.orders import counted, due
from cozygpu.decisions.usestatus import ClassTotals, budget_status
from cozygpu.kube.adapter import ApiError
from cozygpu.runtime.breath import Breath
from cozygpu.runtime.writes import Body, State, Step, Writer
from cozygpu.state.cluster import Change, Cluster

log = structlog.get_logger("cozygpu.accountant")


def _comparable(node: GPUNode) -> dict[str, object]:
    return node.status.model_dump(mode="json", exclude_none=True)


def _same(status: GPUBudgetStatus, before: GPUBudgetStatus) -> bool:
    """Nothing to write: how far the count went is written with a change, never alone."""
    return status.model_dump(mode="json", exclude={"counted_through"}) == before.model_dump(
        mode="json", exclude={"counted_through"}
    )


BATCH_WINDOW = 0.25
# How soon a budget is looked at again whose record holds orders counted but not yet taken off.
RECOUNT = dt.timedelta(seconds=1)


class Accountant:
    def __init__(self, cluster: Cluster, writer: Writer, *, stop_bare: bool = False) -> None:
        """`stop_bare`: as the binder's evacuator decides it, for the GPUNode's evacuation (§6.8)."""
        self._cluster = cluster
        self._stop_bare = stop_bare
        self._writer = writer
        self._wake = asyncio.Event()
        # Nodes whose write failed (the API did not answer) or lost every race: looked at again a second later.
        self._retry: set[str] = set()
        # Nodes whose GPUNode status may have changed, namespaces whose budgets' use may have.
        self._nodes: set[str] = set()
        self._namespaces: set[str] = set()
        # Each class's serving nodes and units, kept per node; classes to look at again.
        self._totals = ClassTotals()
        self._classes: set[str] = set()
        # When each budget's record of orders (§7.4) next loses one, if nothing looks at it before.
        self._due: dict[tuple[str, str], dt.datetime] = {}

    def changed(self, change: Change) -> None:
        """What the change names may show anew in a GPUNode's or a budget's status (§8, §9); nothing else wakes."""
        if not (change.all_nodes or change.nodes or change.namespaces or change.kind is kinds.GPU_CLASS):
            return
        if change.all_nodes:
            self._nodes |= set(self._cluster.capacity.nodes)
        if change.kind is kinds.GPU_CLASS:
            self._classes.add(change.name)
        self._nodes |= change.nodes
        self._namespaces |= change.namespaces
        self._wake.set()

    async def run(self) -> None:
        self._nodes |= set(self._cluster.capacity.nodes) | set(self._cluster.gpunodes)
        while True:
            self._wake.clear()
            dirty, self._nodes = self._nodes | self._retry, set()
            namespaces, self._namespaces = self._namespaces, set()
            self._retry = set()
            breathe = Breath(every=64)  # every node after a class's change: not at a stretch (§14.3)
            for name in sorted(dirty):
                await breathe()
                self._classes |= self._totals.node_changed(self._cluster, name)
                try:
                    await self._sync(name)
                except ApiError as e:
                    log.warning("gpunode.write_failed", node=name, error=e.message)
                    self._retry.add(name)
            if dirty or namespaces:
                await self._sync_use(namespaces)
            if self._retry:
                await asyncio.sleep(1.0)
                continue
            with contextlib.suppress(TimeoutError):  # not wait_for: on 3.11 it can swallow a cancel
                async with asyncio.timeout(self._next_due()):
                    await self._wake.wait()
            # Status is informational: a short window lets a burst of binds on a node (or of devices
            # of a class) become one write, and one recount, instead of one each.
            await asyncio.sleep(BATCH_WINDOW)

    async def _sync_use(self, namespaces: set[str]) -> None:
        """Budgets covering the changed namespaces; classes whose totals or held units moved (from counters)."""
        budgets = {b.key: b for ns in namespaces for b in covering_budgets(self._cluster, ns)}
        for key, before in sorted(budgets.items()):
            if await self._keep_status(kinds.GPU_BUDGET, key, functools.partial(self._budget_wanted, key)):
                after = self._cluster.budgets.get(key)
                over = after.status.conditions[0] if after is not None and after.status.conditions else None
                was = [c.status for c in before.status.conditions]
                if over is not None and over.status is ConditionStatus.TRUE and ConditionStatus.TRUE not in was:
                    log.info("budget.over", namespace=key[0], budget=key[1], message=over.message)
        touched, self._classes = self._classes, set()
        for cls in sorted(self._cluster.classes.values(), key=lambda c: c.name):
            if cls.name not in touched and self._cluster.capacity.held_of_class(cls.name) == cls.status.held:
                continue
            await self._keep_status(kinds.GPU_CLASS, ("", cls.name), functools.partial(self._class_wanted, cls.name))

    def _budget_wanted(self, key: tuple[str, str]) -> Body | None:
        """The budget with the status the view says, None if it has that already; notes when to look again (§7.4)."""
        budget = self._cluster.budgets.get(key)
        if budget is None:
            return None
        now = utcnow()
        status = budget_status(self._cluster, budget, now)
        when = due([*status.orders, *status.set_aside])
        if any(counted(self._cluster, o) for o in status.orders):
            # Counted from our own write's answer, not yet from the watch: taken off once the watch has it.
            when = min(when or now + RECOUNT, now + RECOUNT)
        if when is not None:
            self._due[key] = when
        else:
            self._due.pop(key, None)
        return None if _same(status, budget.status) else budget.model_copy(update={"status": status}).wire()

    def _class_wanted(self, name: str) -> Body | None:
        cls = self._cluster.classes.get(name)
        if cls is None:
            return None
        wanted = self._totals.status(self._cluster, cls)
        if wanted.model_dump(mode="json") == cls.status.model_dump(mode="json"):
            return None
        return cls.model_copy(update={"status": wanted}).wire()

    async def _keep_status(self, kind: kinds.Kind, key: tuple[str, str], wanted: Callable[[], Body | None]) -> bool:
        """Write the status `wanted` makes from the view, if it differs; one that lost is decided again on the
        winner's version, which the writer put in the view (`Writer.update`). Whether a write landed."""

        async def decide(_: Body | None) -> Step | None:
            body = wanted()
            return None if body is None else functools.partial(self._writer.replace_status, kind, body)

        try:
            outcome = await self._writer.update(None, decide)
        except ApiError as e:
            log.warning("status.write_failed", kind=kind.kind, namespace=key[0] or None, name=key[1], error=e.message)
            return False
        if outcome.state is State.CONFLICT:  # raced every time: looked at again on the next pass
            if kind is kinds.GPU_CLASS:
                self._classes.add(key[1])
            self._namespaces.add(key[0])
            self._wake.set()
        return outcome.written

    def _next_due(self) -> float | None:
        """Seconds until a budget's record next loses an order (its namespace is looked at again then), or None."""
        if not self._due:
            return None
        now = utcnow()
        for key in [k for k, when in self._due.items() if when <= now]:
            del self._due[key]
            self._namespaces.add(key[0])
        if self._namespaces:
            return 0
        return max(0.0, (min(self._due.values()) - now).total_seconds()) if self._due else None

    async def _sync(self, name: str) -> None:
        """Bring the node's GPUNode to what the view says (§8.3): create, update or delete it. Each write is decided
        on the view, which holds what a write that lost read (`Writer.update`); a create is followed by its status."""
        verb = ""

        async def decide(_: Body | None) -> Step | None:
            nonlocal verb
            existing = self._cluster.gpunodes.get(name)
            previous = existing.status.conditions if existing else []
            evacuated = (existing.status.evacuated or 0) if existing else 0  # the evacuator's count, kept
            status = gpunode_status(
                self._cluster, name, previous, utcnow(), stop_bare=self._stop_bare, evacuated=evacuated
            )
            if status is None:
                if existing is None:
                    return None
                verb, uid = "deleted", existing.metadata.uid
                return lambda: self._writer.delete(kinds.GPU_NODE, name, uid=uid, at_once=True)
            if existing is None:
                verb, body = "created", {"apiVersion": API_VERSION, "kind": "GPUNode", "metadata": {"name": name}}
                return lambda: self._writer.create(kinds.GPU_NODE, body)
            wanted = existing.model_copy(update={"status": status})
            if _comparable(wanted) == _comparable(existing):
                return None
            verb = "updated"
            return lambda: self._writer.replace_status(kinds.GPU_NODE, wanted.wire())

        # At most: a status write that finds the object gone, its create, the create's status, a look at what is left.
        for _ in range(4):
            outcome = await self._writer.update(None, decide)
            if outcome.state is State.CONFLICT:  # raced every time: looked at again
                self._retry.add(name)
                return
            if outcome.state is State.CURRENT:  # nothing left to write
                return
            if outcome.state is State.LANDED:
                node = self._cluster.gpunodes.get(name)
                summary = node.status.summary if node is not None and verb == "updated" else None
                log.info(f"gpunode.{verb}", node=name, **({"summary": summary} if summary is not None else {}))
            # GONE (the view forgot it): decided again, on nothing there.
