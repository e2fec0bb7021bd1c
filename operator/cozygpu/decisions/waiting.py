"""The binder's waiting room (§5.5, §5.6): which devices wait for a node, in what order, which turned Lost.

Called by the binder (runtime.binder) on each pass; pure reads of the view. First come
first served is by creation time, then by when the view first saw the device (creation
timestamps have one-second precision), then by name.
"""

from __future__ import annotations

from collections.abc import Iterator

from cozygpu.api import GPUDevice, Phase
from cozygpu.api.names import LABEL_TEMPLATE_DEVICE, TRUE
from cozygpu.state.cluster import Cluster


def placeable(device: GPUDevice) -> bool:
    """Whether the binder may place the device on its own, outside any bind request."""
    request = device.status.bind_request
    if device.deleting or (request is not None and request.result is None):
        return False  # an open request is answered as a set (§4)
    if device.status.phase is None and device.metadata.labels.get(LABEL_TEMPLATE_DEVICE) == TRUE:
        return False  # a template device belongs to its VMI's admission
    # §2: a Lost device still attached waits until its VMI is gone.
    return not (device.status.phase is Phase.LOST and device.status.attached_to is not None)


def in_turn(cluster: Cluster, devices: list[GPUDevice] | None = None) -> list[GPUDevice]:
    """The placeable ones among `devices` (every device not Bound if None, in the order the view keeps),
    first come first served (§5.5, `Cluster.turn`)."""
    if devices is None:
        return [d for d in cluster.unbound_in_turn() if placeable(d)]
    return sorted((d for d in devices if placeable(d)), key=cluster.turn)


def lost(cluster: Cluster) -> Iterator[tuple[GPUDevice, str]]:
    """§5.6: Bound devices whose node the view no longer has, with that node; derived from the view each time,
    so a Lost write that lost a conflict is simply tried again."""
    for node in cluster.gone_nodes():
        for device in list(cluster.devices_on(node)):
            if device.holds_gpus and device.status.node_name == node:
                yield device, node
