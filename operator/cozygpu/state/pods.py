"""The units of extended resources that pods hold on nodes, kept from pod events (§1.3, §12).

kube-scheduler and the kubelet count every pod's units; the operator counts only its
Bound devices. This index lets the GPUNode status show the difference: units held by
pods the operator did not place (launchers of VMIs it did not admit, pods created before
the no-bypass policy, pods in an exempt namespace), so a bypass that predates the guard
is visible. Callers: the runtime's pod watch feeds `Cluster.pods` (`upsert`, `remove`;
both return the nodes whose GPUNode status may differ now); the node accountant's
decision (`decisions.nodestatus`) reads `on(node)`.

A pod is kept only while it holds units: it is on a node (`spec.nodeName`), has not ended
(phase Succeeded or Failed) and asks for an extended resource (`api.pods.is_extended`).
Of such a pod only what the decision reads is kept, not its body (§13.3). An event older
than what is stored is ignored, and so is one of a pod removed or ended since
(`tombstones`), as in `cluster`. An odd body never raises: what cannot be read asks for
nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from cozygpu.api.pods import EXTENDED, asked, launcher_of, owner_vmi, watched
from cozygpu.state.store import writes
from cozygpu.state.tombstones import DEFAULT_LIMIT, Tombstones, version

PodKey = tuple[str, str]  # (namespace, name)

ENDED = ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class PodUse:
    """A pod's hold on a node: units per extended resource, and the VMI it is the launcher of, if any."""

    namespace: str
    name: str
    node: str
    units: Mapping[str, int]
    vmi: str | None = None
    resource_version: int = 0
    vmi_uid: str | None = None  # the uid of that VMI: a guest runs for it until the pod ends (§6.7)
    watched: bool = False  # the launcher informer's selection covers it (a launcher not covered is read every sweep)

    @property
    def ident(self) -> str:
        return f"{self.namespace}/{self.name}"


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


class PodUsage:
    """Pods that hold extended resources on a node, by key and by node."""

    def __init__(self, tombstones: int = DEFAULT_LIMIT) -> None:
        self._pods: dict[PodKey, PodUse] = {}
        self._on: dict[str, set[PodKey]] = {}
        # Launchers holding units by their VMI's (namespace, uid) (§6.7): an owner reference names an object of
        # the pod's own namespace, so a pod elsewhere naming a victim's uid is no guest of it. And the VMIs
        # (namespace, name) whose launcher stopped holding units since the owner last took them (`take_ended`).
        self._guests: dict[tuple[str, str], set[PodKey]] = {}
        # Launchers holding units by their VMI's (namespace, name), whatever its uid: a new VMI of the name waits
        # for the old guest to end (§6.7).
        self._by_vmi: dict[tuple[str, str], set[PodKey]] = {}
        self._ended: set[tuple[str, str]] = set()
        # Pods removed or ended: a late event of an earlier version must not bring them back.
        self._gone = Tombstones(tombstones)

    @writes
    def upsert(self, body: Any) -> set[str]:
        """Store what the pod holds now, or forget it if it holds nothing; the nodes whose usage changed."""
        body = _dict(body)
        meta = _dict(body.get("metadata"))
        key = (_str(meta.get("namespace")), _str(meta.get("name")))
        rv = meta.get("resourceVersion") if isinstance(meta.get("resourceVersion"), str) else None
        if not key[1] or self._gone.stale(key, rv):
            return set()
        old = self._pods.get(key)
        if old is not None and version(rv) < old.resource_version:
            return set()
        spec, status = _dict(body.get("spec")), _dict(body.get("status"))
        asks = asked(body, EXTENDED, lenient=True)
        ended = status.get("phase") in ENDED
        if ended and (asks or old is not None):
            self._gone.bury(key, version(rv))  # an ended pod never holds units again
        node = _str(spec.get("nodeName"))
        if ended or not asks or not node:
            return self._forget(key)
        vmi = launcher_of(body)
        owner = owner_vmi(body) if vmi else None
        vmi_uid = owner[1] if owner and owner[1] else None
        if old is not None and old.vmi is not None:
            # Whose launcher a pod is stays while it lives: a guest runs in it whatever its labels or owner
            # references are changed to (issue 34 item 1).
            vmi, vmi_uid = old.vmi, old.vmi_uid
        new = PodUse(
            namespace=sys.intern(key[0]),
            name=key[1],
            node=sys.intern(node),
            units={sys.intern(r): n for r, n in asks.items()},
            vmi=vmi,
            resource_version=version(rv),
            vmi_uid=vmi_uid,
            watched=watched(body),
        )
        self._pods[key] = new
        if old is not None and (old.node, old.units, old.vmi, old.vmi_uid) == (
            new.node,
            new.units,
            new.vmi,
            new.vmi_uid,
        ):
            return set()
        if old is not None:
            self._unindex(key, old)
        self._on.setdefault(new.node, set()).add(key)
        if new.vmi_uid:
            self._guests.setdefault((new.namespace, new.vmi_uid), set()).add(key)
        if new.vmi:
            self._by_vmi.setdefault((new.namespace, new.vmi), set()).add(key)
        return {new.node} | ({old.node} if old is not None else set())

    @writes
    def remove(self, namespace: str, name: str, resource_version: str | None = None) -> set[str]:
        """Forget the pod; `resource_version` is the removal's (a DELETED event's), if known. Only pods the
        index held leave a tombstone: most deleted pods never asked for a GPU."""
        key = (namespace, name)
        old = self._pods.get(key)
        if old is not None:
            self._gone.bury(key, max(version(resource_version), old.resource_version))
        return self._forget(key)

    def _forget(self, key: PodKey) -> set[str]:
        old = self._pods.pop(key, None)
        if old is None:
            return set()
        self._unindex(key, old)
        return {old.node}

    def _unindex(self, key: PodKey, old: PodUse) -> None:
        indexes: tuple[tuple[dict[Any, set[PodKey]], Any], ...] = (
            (self._on, old.node),
            (self._guests, (old.namespace, old.vmi_uid) if old.vmi_uid else None),
            (self._by_vmi, (old.namespace, old.vmi) if old.vmi else None),
        )
        for index, value in indexes:
            keys = index.get(value) if value else None
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del index[value]
        if old.vmi_uid and old.vmi and (old.namespace, old.vmi_uid) not in self._guests:
            self._ended.add((old.namespace, old.vmi))

    def guest_running(self, namespace: str, vmi_uid: str) -> bool:
        """Whether a launcher pod of the namespace's VMI with this uid still holds units on a node (§6.7)."""
        return (namespace, vmi_uid) in self._guests

    def launchers_of(self, namespace: str, vmi: str) -> list[PodUse]:
        """The launcher pods of any VMI of this name that hold units, by name."""
        return [self._pods[k] for k in sorted(self._by_vmi.get((namespace, vmi), ()))]

    @writes
    def take_ended(self) -> set[tuple[str, str]]:
        """The VMIs (namespace, name) whose last launcher stopped holding units since the last call."""
        ended, self._ended = self._ended, set()
        return ended

    def on(self, node: str) -> list[PodUse]:
        """The pods holding units on the node, by namespace and name."""
        return [self._pods[k] for k in sorted(self._on.get(node, ()))]

    def holds_on(self, node: str) -> bool:
        return node in self._on

    def nodes(self) -> list[str]:
        """The nodes some pod here holds units on."""
        return list(self._on)

    def get(self, namespace: str, name: str) -> PodUse | None:
        return self._pods.get((namespace, name))

    def version(self, key: PodKey) -> int | None:
        """The version of the pod held under the key (`store.Versioned`), None if none is held."""
        pod = self._pods.get(key)
        return None if pod is None else pod.resource_version

    def keys(self) -> Iterator[PodKey]:
        return iter(list(self._pods))

    def __len__(self) -> int:
        return len(self._pods)

    def missing(self, listed: set[PodKey], list_version: str | None) -> list[PodKey]:
        """Pods held here that a list at `list_version` lacks, stored at a version no newer: removed while no
        watch event could say so (as `Cluster.missing`)."""
        limit = version(list_version)
        return sorted(k for k, p in self._pods.items() if k not in listed and p.resource_version <= limit)


class PodReads:
    """The pods part as workers and decisions read it (`Cluster.pods`): pods holding units, by key, node and VMI."""

    def __init__(self, part: PodUsage, unmanaged_on: Callable[[str], list[tuple[PodUse, dict[str, int]]]]) -> None:
        self.get = part.get
        self.keys = part.keys
        self.on = part.on
        self.launchers_of = part.launchers_of
        self.guest_running = part.guest_running
        self.holding = part.__len__
        # What of them the operator did not place (`state.unmanaged`, §12).
        self.unmanaged_on = unmanaged_on
