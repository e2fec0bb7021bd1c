"""KubeVirt in the loop (§11.1): a control plane with KubeVirt's controllers, the operator on it, and fake nodes as
virt-handler leaves them."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from cozygpu.api import kinds
from cozygpu.devcluster import binaries, identity, nodes
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import Kube
from tests.support.harness import OperatorProcess, wait_for
from tests.support.nodes import Gpu


def kubevirt_plane() -> Iterator[ControlPlane]:
    """A control plane with KubeVirt's controllers, for a fixture of any scope; skips saying why where it cannot."""
    plane = ControlPlane(kubevirt=True)
    try:
        plane.start(timeout=180)
    except binaries.KubeVirtUnavailable as e:
        pytest.skip(f"KubeVirt in the loop: {e}; see the README (KUBEVIRT_SRC or KUBEVIRT_ASSETS)")
    yield plane
    plane.stop()


def kubevirt_operator(plane: ControlPlane, directory: Path) -> Iterator[OperatorProcess]:
    """The operator with its webhooks (--dev), as its own ServiceAccount under the chart's RBAC."""
    kubeconfig = identity.write_kubeconfig(plane, directory / "kubeconfig")
    process = OperatorProcess(kubeconfig, directory / "operator.log", "--dev", "--bind-timeout", "5").start()
    yield process
    process.stop()


def add_kubevirt_node(
    kube: Kube, gpu: Gpu, units: int, *, labels: Mapping[str, str] | None = None, small: bool = False
) -> str:
    """A node as virt-handler would leave it, with `units` of the GPU resource; `small`: 2 CPUs, so kube-scheduler's
    scoring shuns it. Returns once the operator has heard of it: it decides from its view."""
    name = f"kv-node-{uuid.uuid4().hex[:6]}"
    resources: dict[str, int | str] = {gpu.resource: units}
    if small:
        resources |= {"cpu": "2", "memory": "4Gi"}
    nodes.create_gpu_node(kube, name, resources, labels=labels, kubevirt=True)
    return name


def wait_until_kubevirt_node_accounted(kube: Kube, name: str, units: int) -> None:
    """Wait until the node's GPUNode shows `units`: the operator decides from its view, which hears of it later."""

    def accounted() -> bool:
        body = kube.get_or_none(kinds.GPU_NODE, name) or {}
        return any(r["allocatable"] == units for r in body.get("status", {}).get("resources", []))

    wait_for(f"GPUNode {name} accounted", accounted, timeout=20)


class Nodes:
    """Fake nodes as virt-handler would leave them, with units of the test's GPU resource."""

    def __init__(self, kube: Kube, gpu: Gpu) -> None:
        self._kube = kube
        self._gpu = gpu
        self.made: list[str] = []

    def add(self, units: int, *, labels: Mapping[str, str] | None = None, small: bool = False) -> str:
        """A node with `units` of the GPU resource; `small`: 2 CPUs, so kube-scheduler's scoring shuns it."""
        name = add_kubevirt_node(self._kube, self._gpu, units, labels=labels, small=small)
        self.made.append(name)
        # The operator decides from its view: wait until it has heard of the node.
        wait_until_kubevirt_node_accounted(self._kube, name, units)
        return name


KVNodeFactory = Callable[[int], str]
