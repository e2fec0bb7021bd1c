"""GPUs as the tests use them: a fresh resource and class per test, and waiting until the operator has a node."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cozygpu.api import kinds
from cozygpu.kube.adapter import Body, Kube
from tests.support.harness import wait_for
from tests.support.operators import operator_running


@dataclass(frozen=True)
class Gpu:
    """A test's own GPU resource name and the passthrough class serving it: no other test's nodes compete."""

    resource: str
    cls: str


def fresh_gpu() -> Gpu:
    """A Gpu named afresh (its class is the fixture's to create)."""
    tag = uuid.uuid4().hex[:6]
    return Gpu(f"example.com/gpu-{tag}", f"cls-{tag}")


GPUNodeFactory = Callable[..., Body]

_node_numbers = itertools.count()


def gpu_node_name() -> str:
    """A fake GPU node's name, unique in the session."""
    return f"gpu-node-{next(_node_numbers)}-{uuid.uuid4().hex[:4]}"


def wait_until_accounted(kube: Kube, node: str, gpus: Mapping[str, int], labels: Mapping[str, str]) -> None:
    """When a class serves the node and an operator runs, wait until its GPUNode shows the units.

    The operator decides from its view, which hears of a new node a moment later; a test
    that creates a device right after the node would otherwise race that watch event.
    """
    served = {
        c["spec"]["resourceName"]
        for c in kube.list(kinds.GPU_CLASS)
        if c["spec"]["resourceName"] in gpus
        and all(labels.get(k) == v for k, v in (c["spec"].get("nodeSelector") or {}).items())
    }
    if not served or not operator_running():
        return

    def accounted() -> bool:
        body = kube.get_or_none(kinds.GPU_NODE, node) or {}
        have = {r["name"]: r["allocatable"] for r in body.get("status", {}).get("resources", [])}
        return all(have.get(r) == gpus[r] for r in served)

    wait_for(f"GPUNode {node} accounted", accounted, timeout=20)
