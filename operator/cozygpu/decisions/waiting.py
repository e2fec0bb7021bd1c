"""The binder's waiting room (§5.5, §5.6): which devices wait for a node, in what order, which turned Lost.

Called by the binder (runtime.workers.binder) on each pass; pure reads of the view. First come
first served is by creation time, then by when the view first saw the device (creation
timestamps have one-second precision), then by name.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

from cozygpu.api import GPUDevice
from cozygpu.state.cluster import Cluster, DeviceKey


def in_turn(cluster: Cluster, devices: list[GPUDevice] | None = None) -> list[GPUDevice]:
    """The placeable ones among `devices` (every device not Bound if None, in the order the view keeps),
    first come first served (§5.5, `Cluster.devices.turn`)."""
    if devices is None:
        return [d for d in cluster.devices.unbound_in_turn() if d.awaits_node]
    return sorted((d for d in devices if d.awaits_node), key=cluster.devices.turn)


def must_decide(cluster: Cluster, served: Iterable[str], fresh: Iterable[DeviceKey]) -> list[GPUDevice]:
    """What a pass decides whatever the room, oldest first: the devices new or changed since the last pass
    (`fresh`), and every waiting device of a class whose serving nodes changed (`served`): their reasons
    read differently now."""
    picked: dict[DeviceKey, GPUDevice] = {}
    for cls in served:
        picked.update((d.key, d) for d in cluster.devices.waiting(cls))
    for key in fresh:
        device = cluster.devices.get(key)
        if device is not None and device.awaits_node:
            picked[key] = device
    return sorted(picked.values(), key=cluster.devices.turn)


def oldest(cluster: Cluster, classes: Iterable[str]) -> set[DeviceKey]:
    """The oldest waiting device of each class and count: where idle moves may make room for some device of a
    class, those are decided again (§5.5, §5.7), so older orders that no move can place do not keep a younger one
    of another size waiting that some can. O(counts waiting) per class."""
    return {d.key for name in classes for d in cluster.devices.heads_waiting(name)}


def overtakes(cluster: Cluster, device: GPUDevice) -> bool:
    """§5.5: whether an older device of its class waits that fits somewhere now: room that appeared while a pass
    was under way goes to that one first, not to this one. O(log n) from the view's indexes."""
    name = device.spec.class_name
    oldest = cluster.devices.next_waiting(name, cluster.capacity.serving.most_free(name), None)
    return oldest is not None and cluster.devices.turn(oldest) < cluster.devices.turn(device)


def fits_now(cluster: Cluster, device: GPUDevice) -> bool:
    """Whether some node serving the device's class has its units free: O(1) from the view's index."""
    return 0 < device.spec.count <= cluster.capacity.serving.most_free(device.spec.class_name)


def woken(cluster: Cluster, class_name: str) -> Iterator[GPUDevice]:
    """The class's waiting devices that fit somewhere, in turn, looked at lazily: room for one device visits
    about one, and a class whose room is spent ends the walk (§14.3)."""
    after = None
    while (most := cluster.capacity.serving.most_free(class_name)) > 0:
        device = cluster.devices.next_waiting(class_name, most, after)
        if device is None:
            return
        after = cluster.devices.turn(device)
        yield device


def to_decide(cluster: Cluster, musts: list[GPUDevice], room: Iterable[str]) -> Iterator[tuple[GPUDevice, bool]]:
    """One pass's devices, oldest first (§5.5): `musts` (`must_decide`), then merged in turn the devices of the
    classes that gained room and fit in it, each once. The flag says a device is there for room alone: decide
    it only if it still `fits_now`. A backlog that cannot fit is never visited."""
    streams = [((cluster.devices.turn(d), False, d) for d in musts)]
    streams += [((cluster.devices.turn(d), True, d) for d in woken(cluster, cls)) for cls in sorted(room)]
    seen: set[DeviceKey] = set()
    for _, for_room, device in heapq.merge(*streams, key=lambda item: item[0]):
        key = device.key
        if key not in seen:
            seen.add(key)
            yield device, for_room


def lost(cluster: Cluster) -> Iterator[tuple[GPUDevice, str]]:
    """§5.6: Bound devices whose node the view no longer has, with that node; derived from the view each time,
    so a Lost write that lost a conflict is simply tried again."""
    for node in cluster.gone_nodes():
        for device in list(cluster.devices.on(node)):
            if device.holds_gpus and device.status.node_name == node:
                yield device, node
