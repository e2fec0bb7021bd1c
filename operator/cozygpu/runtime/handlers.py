"""The kopf registration: each handler unpacks its arguments and makes one call.

Every kind is observed with `@kopf.on.event` only, so kopf writes no progress
annotations or finalizers on anything, ours or not.
"""

from __future__ import annotations

import asyncio
from typing import Any

import kopf

from cozygpu.api.names import GROUP, VERSION
from cozygpu.runtime.app import Operator, configure_kopf
from cozygpu.settings import Settings

# kind -> (group, version, plural) as kopf selects resources.
RESOURCES = {
    "GPUClass": (GROUP, VERSION, "gpuclasses"),
    "GPUDevice": (GROUP, VERSION, "gpudevices"),
    "GPUBudget": (GROUP, VERSION, "gpubudgets"),
    "GPUNode": (GROUP, VERSION, "gpunodes"),
    "Node": ("", "v1", "nodes"),
    "Namespace": ("", "v1", "namespaces"),
}


async def run(settings: Settings, stop_flag: asyncio.Event | None = None) -> None:
    """Run the operator until stopped (a signal, or `stop_flag`)."""
    operator = Operator(settings)
    registry = kopf.OperatorRegistry()
    register(registry, operator)
    await kopf.operator(registry=registry, clusterwide=True, standalone=True, stop_flag=stop_flag)


def register(registry: kopf.OperatorRegistry, operator: Operator) -> None:
    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_kopf(settings)
        await operator.startup()

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        await operator.cleanup()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo:
        return operator.login(kwargs)

    for kind, (group, version, plural) in RESOURCES.items():
        _observe(registry, operator, kind, (group, version, plural))


def _observe(registry: kopf.OperatorRegistry, operator: Operator, kind: str, resource: tuple[str, str, str]) -> None:
    group, version, plural = resource

    @kopf.on.event(group, version, plural, registry=registry, id=f"observe-{plural}")
    async def observe(event: kopf.RawEvent, **_: Any) -> None:
        # Async on purpose: kopf runs sync handlers in threads, and the view is single-threaded.
        operator.on_event(kind, dict(event))
