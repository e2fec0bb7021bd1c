"""What one event did to the view (`Change`), and what a decision counted before its write (`Assumption`).

Callers: `state.indexers` makes them; runtime.view hands each `Change` to the workers that
subscribed to its kind, each keeping its own queue from the hints it carries.
"""

from __future__ import annotations

import dataclasses

from cozygpu.api.kinds import Kind

DeviceKey = tuple[str, str]  # (namespace, name)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Change:
    """What one event, list item or write's response did to the view; the workers that care subscribe.

    `stored` is False when the view ignored it (older than what it holds, a removed object's echo) or it
    changed nothing the view keeps (a VMI's status: only its uid and references are kept).
    `nodes` and `namespaces` name where derived status may differ now (GPUNode §8, budget use §9);
    `all_nodes` when a class changed, since any node may serve it or stop serving it. `room` names the
    classes where a waiting device may fit now (units freed, a node started serving, §5.5); `served` the
    classes whose waiting devices' reasons may read differently (no node had the class's resource and one has,
    or the other way round; the class changed or became ready), so every one is decided again; `guests_gone` the
    VMIs whose last launcher pod stopped holding units, so their sets may be released now (§6.7); `reach` the
    classes where free plus idle held units rose on a serving node, so idle moves may make room now (§5.7)."""

    kind: Kind
    namespace: str
    name: str
    deleted: bool
    stored: bool
    nodes: frozenset[str] = frozenset()
    namespaces: frozenset[str] = frozenset()
    all_nodes: bool = False
    room: frozenset[str] = frozenset()
    served: frozenset[str] = frozenset()
    guests_gone: frozenset[DeviceKey] = frozenset()  # VMIs (namespace, name) whose last launcher pod ended (§6.7)
    reach: frozenset[str] = frozenset()  # classes where a waiting device may fit with idle moves now (§5.7)

    @property
    def key(self) -> DeviceKey:
        return (self.namespace, self.name)


@dataclasses.dataclass(frozen=True)
class Assumption:
    """A decision counted in the view before its write returns (runtime.view's `assume`): its token for
    `settle`, and the classes where it freed room (a gather moving a device off a node)."""

    token: int
    room: frozenset[str]
