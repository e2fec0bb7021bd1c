"""GPUBudgets by the namespaces they cover (§1.4), with the units in use under each (§7.2).

Callers: `state.indexers` keeps it current from budget and namespace events and
from every change of a namespace's use (`add_use`, the units in use per namespace and class
are kept here too); `decisions.budgets` reads it through the view.
A budget check then costs the budgets covering one namespace, not a walk of every budget
and every namespace. A namespace's event costs the budgets that have a namespaceSelector
(an administrator's few); only such a budget's own event walks the namespaces.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from cozygpu.api import GPUBudget
from cozygpu.api.selectors import selector_matches
from cozygpu.state.counts import add as _add
from cozygpu.state.store import ReadOnly, Store, writes
from cozygpu.state.tombstones import DEFAULT_LIMIT

BudgetKey = tuple[str, str]  # (namespace, name)


class BudgetIndex:
    """Budgets by key; which namespaces each covers and which cover each; per budget, units in use per class.

    A budget covers its own namespace, and the namespaces the view knows that its selector
    matches; its tally is the use of exactly those namespaces."""

    def __init__(self, tombstones: int = DEFAULT_LIMIT) -> None:
        self.store: Store[BudgetKey, GPUBudget] = Store(tombstones)
        self.budgets = self.store.items
        # Units in use per namespace and class (§7.2, `GPUDevice.in_use`).
        self._use: dict[str, dict[str, int]] = {}
        self._covers: dict[BudgetKey, set[str]] = {}
        self._covering: dict[str, set[BudgetKey]] = {}
        self._selecting: set[BudgetKey] = set()
        self._used: dict[BudgetKey, dict[str, int]] = {}

    @writes
    def put(self, budget: GPUBudget, namespaces: Iterable[str], labels: Callable[[str], Mapping[str, str]]) -> None:
        """Store a budget; what it covers is worked out anew only when it is new or its selector changed."""
        key = budget.key
        old = self.store.put(key, budget, budget.metadata.resource_version)
        if old is not None and old.spec.namespace_selector == budget.spec.namespace_selector:
            return
        self._forget(key)
        selector = budget.spec.namespace_selector
        covered = {key[0]}
        if selector is not None:
            self._selecting.add(key)
            covered |= {ns for ns in namespaces if selector_matches(selector, labels(ns))}
        self._covers[key], self._used[key] = set(), {}
        for namespace in covered:
            self._cover(key, namespace, self._use.get(namespace, {}))

    @writes
    def drop(self, key: BudgetKey, removal: str | None = None) -> GPUBudget | None:
        budget = self.store.pop(key, removal)
        if budget is not None:
            self._forget(key)
        return budget

    @writes
    def relabel(self, namespace: str, labels: Mapping[str, str]) -> set[BudgetKey]:
        """A namespace the view knows appeared or changed labels; returns the budgets that took it up or let go."""
        moved, use = set(), self._use.get(namespace, {})
        for key in self._selecting:
            selector = self.budgets[key].spec.namespace_selector
            covers = namespace == key[0] or selector_matches(selector, labels)
            if covers != (namespace in self._covers[key]):
                (self._cover if covers else self._uncover)(key, namespace, use)
                moved.add(key)
        return moved

    @writes
    def namespace_gone(self, namespace: str) -> set[BudgetKey]:
        """The view forgot a namespace: only budgets of its own still cover it; returns those that let go."""
        moved = {key for key in self._covering.get(namespace, ()) if key[0] != namespace}
        use = self._use.get(namespace, {})
        for key in moved:
            self._uncover(key, namespace, use)
        return moved

    @writes
    def add_use(self, namespace: str, class_name: str, units: int) -> None:
        """Units in use in a namespace changed: the namespace and every budget covering it count them."""
        use = self._use.setdefault(namespace, {})
        _add(use, class_name, units)
        if not use:
            del self._use[namespace]
        for key in self._covering.get(namespace, ()):
            _add(self._used[key], class_name, units)

    def covering(self, namespace: str, known: bool, labels: Mapping[str, str]) -> list[GPUBudget]:
        """Budgets whose limits apply to orders in the namespace, by (namespace, name).

        A namespace the view does not know yet is covered by what selects it by its name
        label alone (checked here: such namespaces are not indexed), as selectors see it."""
        keys = set(self._covering.get(namespace, ()))
        if not known:
            keys |= {k for k in self._selecting if selector_matches(self.budgets[k].spec.namespace_selector, labels)}
        return [self.budgets[k] for k in sorted(keys)]

    def use_in(self, namespace: str) -> dict[str, int]:
        """Units in use per class in the namespace, as budgets count them (§7.2, `GPUDevice.in_use`)."""
        return dict(self._use.get(namespace, {}))

    def used(self, key: BudgetKey) -> dict[str, int]:
        """Units in use per class across the namespaces the budget covers."""
        return dict(self._used.get(key, {}))

    def _cover(self, key: BudgetKey, namespace: str, use: Mapping[str, int]) -> None:
        self._covers[key].add(namespace)
        self._covering.setdefault(namespace, set()).add(key)
        for class_name, units in use.items():
            _add(self._used[key], class_name, units)

    def _uncover(self, key: BudgetKey, namespace: str, use: Mapping[str, int]) -> None:
        self._covers[key].discard(namespace)
        covering = self._covering[namespace]
        covering.discard(key)
        if not covering:
            del self._covering[namespace]
        for class_name, units in use.items():
            _add(self._used[key], class_name, -units)

    def _forget(self, key: BudgetKey) -> None:
        for namespace in self._covers.pop(key, set()):
            covering = self._covering[namespace]
            covering.discard(key)
            if not covering:
                del self._covering[namespace]
        self._used.pop(key, None)
        self._selecting.discard(key)


class BudgetReads(ReadOnly[BudgetKey, GPUBudget]):
    """The budgets part as workers and decisions read it (`Cluster.budgets`): every budget by key, which cover a
    namespace (§1.4) by its labels, and the units in use under each (§7.2)."""

    def __init__(
        self, part: BudgetIndex, namespaces: Mapping[str, object], labels: Callable[[str], Mapping[str, str]]
    ) -> None:
        super().__init__(part.budgets)
        self._part = part
        self._namespaces = namespaces  # the namespaces the view has
        self._labels = labels  # a namespace's labels, with its name's
        self.use_in = part.use_in

    def covering(self, namespace: str) -> list[GPUBudget]:
        """Budgets whose limits apply to orders in the namespace (§1.4), by (namespace, name)."""
        return self._part.covering(namespace, namespace in self._namespaces, self._labels(namespace))

    def use(self, namespace: str, name: str) -> dict[str, int]:
        """Units in use per class in the namespaces the stored budget of that key covers (§7.2)."""
        return self._part.used((namespace, name))
