"""The kopf registration: each handler unpacks its arguments and makes one call.

kopf runs the process (start-up, clean-up, login) and serves the admission handlers
at /<id> on the webhook server the Operator configures. It watches nothing: the
operator's informers (runtime.watching.informer) do, so kopf writes no progress annotations or
finalizers on anything and keeps no per-object state.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import kopf
from kopf._core.reactor import inventory  # kopf keeps its memories' type private

from cozygpu.api import hooks
from cozygpu.kube import credentials
from cozygpu.runtime.process import leadership
from cozygpu.runtime.process.app import Operator
from cozygpu.settings import Settings


class Forgetful(inventory.ResourceMemories):
    """kopf's memory per object, kept for nothing. kopf remembers every object an UPDATE or DELETE review names
    and forgets it only on a watch's deletion event, which it never sees here (it watches nothing): every
    device ever updated, and every made-up uid a caller posts, would stay for the process's life (§14.1).
    Our handlers keep no memo, so kopf may forget each object as soon as it has answered."""

    async def recall(
        self,
        raw_body: Any,
        *,
        memobase: Any = None,
        noticed_by_listing: bool = False,
        ephemeral: bool = False,
    ) -> inventory.ResourceMemory:
        return await super().recall(raw_body, memobase=memobase, noticed_by_listing=noticed_by_listing, ephemeral=True)


def kopf_options(settings: Settings) -> dict[str, Any]:
    """How kopf runs the operator: every namespace, no peering, its memory per object kept for nothing."""
    return {
        "clusterwide": True,
        "standalone": True,
        "memories": Forgetful(),
        "identity": cast(Any, leadership.replica(settings)),
    }


async def run(settings: Settings, stop_flag: asyncio.Event | None = None) -> None:
    """Run the operator until stopped (a signal, drained first; or `stop_flag`, at once)."""
    operator = Operator(settings)
    registry = kopf.OperatorRegistry()
    register(registry, operator)
    outside = asyncio.create_task(_relay(stop_flag, operator.shutdown.stop)) if stop_flag is not None else None
    try:
        await kopf.operator(registry=registry, stop_flag=operator.shutdown.stop, **kopf_options(settings))
    finally:
        if outside is not None:
            outside.cancel()


async def _relay(source: asyncio.Event, target: asyncio.Event) -> None:
    await source.wait()
    target.set()


def register(registry: kopf.OperatorRegistry, operator: Operator) -> None:
    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        await operator.configure(settings)
        await operator.startup()
        operator.shutdown.on_signals()  # after kopf's own handlers: ours replace them

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        await operator.cleanup()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo:
        return credentials.kopf_login(operator.settings.kubeconfig, kwargs)

    if operator.settings.webhook_mode == "off":
        return

    def target(hook: hooks.Hook) -> dict[str, Any]:
        """Where kopf serves the hook and what it admits, from the one table (api.hooks)."""
        kind = hook.kind
        return {
            "group": kind.group,
            "version": kind.version,
            "plural": kind.plural,
            "id": hook.id,
            "operations": list(hook.operations),
            "registry": registry,
        }

    @kopf.on.mutate(**target(hooks.VMI), side_effects=True)
    async def vmi(body: kopf.Body, patch: kopf.Patch, dryrun: bool, **_: Any) -> None:
        await operator.gate.mutate_vmi(_raw(body), patch, dryrun)

    @kopf.on.mutate(**target(hooks.POD))
    async def pod(body: kopf.Body, patch: kopf.Patch, userinfo: kopf.UserInfo, **_: Any) -> None:
        operator.gate.mutate_pod(_raw(body), patch, str(userinfo.get("username", "")))

    @kopf.on.validate(**target(hooks.DEVICE))
    async def gpudevice(userinfo: kopf.UserInfo, dryrun: bool, **kw: Any) -> None:
        user = str(userinfo.get("username", ""))
        await operator.gate.validate_device(kw["operation"], _raw(kw["new"]), _raw(kw["old"]), user, dryrun)

    @kopf.on.validate(**target(hooks.CLASS))
    async def gpuclass(**kw: Any) -> None:
        operator.gate.validate_class(kw["operation"], _raw(kw["new"]), _raw(kw["old"]))

    @kopf.on.validate(**target(hooks.BUDGET))
    async def gpubudget(warnings: list[str], **kw: Any) -> None:
        operator.gate.validate_budget(_raw(kw["new"]), warnings)


def _raw(body: kopf.Body | None) -> Any:
    return None if body is None else {k: v for k, v in body.items()}
