"""VMIs as the view keeps them: the uid of the one of each name, and the devices it names (§6, §14.2).

Callers: `state.indexers` stores them from VMI events (`put`, `pop`) and measures a VMI's set by
them (`set_of`); the collector and the webhooks read `names_device`, `exists` and the rest
through `VmiReads` (`Cluster.vmis`). Nothing else of a VMI is kept (§13.3).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cozygpu.api import GPUDevice, kinds, references
from cozygpu.api.names import ANNOTATION_DEVICES, LABEL_DEVICE_REFERENCE, TRUE
from cozygpu.state.store import ReadOnly, Store, writes
from cozygpu.state.tombstones import DEFAULT_LIMIT

VmiKey = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class Mark:
    """KubeVirt marked the VMI for evacuation off `node` (`status.evacuationNodeName`, §6.8): its own eviction
    strategy (None: the cluster's), and the order the view saw marks in (`seq`: oldest first)."""

    node: str
    strategy: str | None
    seq: int


class Vmis:
    def __init__(self, attached_to: Callable[[str, str], list[GPUDevice]], tombstones: int = DEFAULT_LIMIT) -> None:
        self._attached_to = attached_to  # devices whose attachment names a VMI of the name (`state.devices`)
        # The uid of the VMI of each name: a new VMI of the name is another VMI (§6.2).
        self.store: Store[VmiKey, str] = Store(tombstones)
        self.uids: Mapping[VmiKey, str] = self.store.items
        # And the devices each names (§14.2): a device a losing create of the name attached is not the VMI's.
        self._names: dict[VmiKey, frozenset[str]] = {}
        self._all_uids: set[str] = set()
        # Of each labelled VMI, the object (uid) whose devices annotation was last read and the text's hash (a
        # process's own seed: no tenant can make another text hash alike on purpose).
        self._read: dict[VmiKey, tuple[str, int]] = {}
        # The VirtualMachine that controls it (name, uid), if one does: its template devices outlive it (§6.6).
        self._vm: dict[VmiKey, tuple[str, str]] = {}
        # Labelled VMIs (those with device references) KubeVirt marked for evacuation (§6.8): few, a drain's.
        self._marked: dict[VmiKey, Mark] = {}
        self._marked_off: dict[str, set[VmiKey]] = {}  # by the node marked off: a node's status reads its own
        self._marks = 0

    @writes
    def put(self, body: dict[str, Any]) -> VmiKey | None:
        """Store the VMI unless the view holds a newer one or it was removed since; its key if what the view keeps
        of it (uid, references) changed. A status update, the bulk of a VMI's events, changes neither."""
        meta = body.get("metadata", {})
        key: VmiKey = kinds.VMI.key_of(body)
        if not self.store.news(key, meta.get("resourceVersion")):
            return None
        uid, names = meta.get("uid", ""), self._names_in(key, meta)
        old = self.store.put(key, uid, meta.get("resourceVersion"))
        vm = next(
            (
                (o.get("name", ""), o.get("uid", ""))
                for o in meta.get("ownerReferences") or []
                if o.get("kind") == "VirtualMachine" and o.get("controller")
            ),
            None,
        )
        if vm is None:
            self._vm.pop(key, None)
        else:
            self._vm[key] = vm
        marked = self._mark(key, body, meta)
        if old == uid and self._names.get(key) == names and not marked:
            return None
        self._all_uids.discard(old or "")
        self._all_uids.add(uid)
        self._names[key] = names
        return key

    def _mark(self, key: VmiKey, body: dict[str, Any], meta: dict[str, Any]) -> bool:
        """Keep the VMI's evacuation mark (§6.8) if it has device references; whether the mark changed."""
        labels = meta.get("labels")
        referencing = isinstance(labels, dict) and labels.get(LABEL_DEVICE_REFERENCE) == TRUE
        node = (body.get("status") or {}).get("evacuationNodeName") if referencing else None
        if not node or not isinstance(node, str):
            return self._unmark(key)
        strategy = (body.get("spec") or {}).get("evictionStrategy")
        strategy = strategy if isinstance(strategy, str) else None
        held = self._marked.get(key)
        if held is not None and (held.node, held.strategy) == (node, strategy):
            return False
        self._marks += 1
        self._unmark(key)
        self._marked[key] = Mark(node, strategy, held.seq if held is not None else self._marks)
        self._marked_off.setdefault(node, set()).add(key)
        return True

    def _unmark(self, key: VmiKey) -> bool:
        held = self._marked.pop(key, None)
        if held is None:
            return False
        keys = self._marked_off.get(held.node, set())
        keys.discard(key)
        if not keys:
            self._marked_off.pop(held.node, None)
        return True

    def _names_in(self, key: VmiKey, meta: dict[str, Any]) -> frozenset[str]:
        """The devices the VMI names, read from its annotation only when it is labelled (no other VMI went through
        our admission) and the annotation's text changed: every replica hears every VMI event, and one tenant
        patching a fat VMI must not cost them a parse each (issue 34 item 2). A label taken off after admission
        changes nothing that VMI object was admitted with; another object of the name (a re-create a watch gap
        hid) is judged on its own."""
        annotations = meta.get("annotations")
        text = annotations.get(ANNOTATION_DEVICES) if isinstance(annotations, dict) else None
        labels = meta.get("labels")
        labelled = isinstance(labels, dict) and labels.get(LABEL_DEVICE_REFERENCE) == TRUE
        uid, seen = meta.get("uid", ""), self._read.get(key)
        if seen is not None and seen[0] == uid and (not labelled or seen[1] == hash(text)):
            return self._names.get(key, frozenset())
        if not labelled:
            self._read.pop(key, None)
            return frozenset()
        self._read[key] = (uid, hash(text))
        return references.device_names(key[1], annotations)

    @writes
    def pop(self, key: VmiKey, removal: str | None) -> bool:
        """Forget the VMI; whether the view held one of the name."""
        held = key in self.store
        self._all_uids.discard(self.store.pop(key, removal) or "")
        self._names.pop(key, None)
        self._read.pop(key, None)
        self._vm.pop(key, None)
        self._unmark(key)
        return held

    def vm_of(self, namespace: str, vmi: str) -> tuple[str, str] | None:
        """The VirtualMachine (name, uid) that controls the VMI of this name the view has, if one does."""
        return self._vm.get((namespace, vmi))

    def mark_of(self, key: VmiKey) -> Mark | None:
        return self._marked.get(key)

    def marked(self, node: str | None = None) -> list[tuple[VmiKey, Mark]]:
        """The VMIs with device references marked for evacuation (§6.8), off `node` (every node if None), the first
        marked first."""
        keys = self._marked if node is None else self._marked_off.get(node, ())
        return sorted(((k, self._marked[k]) for k in keys), key=lambda item: item[1].seq)

    def names_device(self, namespace: str, vmi: str, device: str) -> bool:
        """Whether the VMI of this name that the view has names the device among its references (§14.2)."""
        return device in self._names.get((namespace, vmi), ())

    def exists(self, uid: str) -> bool:
        """Whether a VMI with this uid exists (any namespace, any name)."""
        return bool(uid) and uid in self._all_uids

    def set_of(self, namespace: str, vmi: str, uid: str) -> list[GPUDevice]:
        """The devices attached to the VMI object `uid` of this name: those with its uid recorded, and those not
        recorded yet that it names (§6.1, §14.2). Until the view has that VMI, every unrecorded one counts."""
        live = self.uids.get((namespace, vmi))
        names: frozenset[str] | None = None  # the view has no VMI of the name yet
        if live is not None:
            names = self._names.get((namespace, vmi), frozenset()) if live == uid else frozenset()
        out = []
        for d in self._attached_to(namespace, vmi):
            recorded = d.status.attached_to.uid if d.status.attached_to is not None else None
            if recorded == uid or (recorded is None and (names is None or d.name in names)):
                out.append(d)
        return out


class VmiReads(ReadOnly[VmiKey, str]):
    """The VMIs part as workers and decisions read it (`Cluster.vmis`): the uid of the VMI of each name, the
    devices it names, its VM and its set (§6, §14.2)."""

    def __init__(self, part: Vmis) -> None:
        super().__init__(part.uids)
        self.names_device = part.names_device
        self.exists = part.exists
        self.set_of = part.set_of
        self.vm_of = part.vm_of
        self.marked = part.marked
        self.mark_of = part.mark_of
