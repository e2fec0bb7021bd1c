"""Serving and, with `--dev`, registering the admission webhooks and the no-bypass policy.

Called by the Operator: `serve`, on every replica, waits until kopf's webhook server
accepts connections and reports the webhooks ready; `register`, on the Lease holder in dev
mode, registers what `webhooks` and `policy` build at its own address; `unregister` removes
the webhook configurations it registered on exit and leaves the no-bypass policies, so that
while no operator serves, a labelled VMI is refused rather than admitted without its GPUs
(§12.3). In a cluster the chart installs them and only the wait is done here.
"""

from __future__ import annotations

import asyncio

import structlog

from cozygpu.api import kinds
from cozygpu.kube.adapter import ApiError, AsyncKube, Forbidden, Invalid
from cozygpu.runtime.admission import policy, webhooks
from cozygpu.settings import Settings

log = structlog.get_logger("cozygpu.operator")


class Registration:
    def __init__(self, settings: Settings, kube: AsyncKube, namespace: str) -> None:
        self._settings = settings
        self._kube = kube
        self._namespace = namespace  # the operator's: where the policy's parameter lives (runtime.admission.guard)
        self.serving: webhooks.Serving | None = None  # set by `configure` in dev mode
        self.ready = settings.webhook_mode == "off"
        self.registered = False

    async def serve(self) -> None:
        """Wait until kopf's server accepts connections, then report ready; runs until cancelled, so that a
        stopped task turns readiness off. Every synced replica serves (§10)."""
        port = self.serving.server.port if self.serving is not None else self._settings.webhook_port or 9443
        while True:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        self.ready = True
        await asyncio.Event().wait()

    async def register(self, operator_user: str) -> None:
        """Dev mode, on the Lease holder: register the webhooks at this replica's own address, and the no-bypass
        policy (in a cluster the chart installs both, and this only waits)."""
        if self.serving is not None and not self.registered:
            await self._register(operator_user)
        await asyncio.Event().wait()  # a supervised worker runs until cancelled

    async def _register(self, operator_user: str) -> None:
        assert self.serving is not None
        while not self.ready:  # the API server calls the webhooks as soon as they are registered
            await asyncio.sleep(0.05)
        for config in webhooks.configurations(
            self.serving.url, self.serving.ca_bundle, self._settings.webhook_timeout, operator_user
        ):
            kind = kinds.MUTATING_WEBHOOKS if config["kind"].startswith("Mutating") else kinds.VALIDATING_WEBHOOKS
            await self._kube.put_object(kind, config)
        try:
            exempt = policy.exempt_of(self._namespace, self._settings.exempt_namespaces)
            # The configurations are in place: the second policy, bound to the mutating one, refuses nothing here.
            for built, bound in (
                (policy.policy(self._settings.kubevirt_controller_user), policy.binding(self._namespace, exempt)),
                (policy.webhooks_policy(), policy.webhooks_binding(exempt)),
            ):
                await self._kube.put_object(kinds.POLICY, built)
                await self._kube.put_object(kinds.POLICY_BINDING, bound)
        except (Forbidden, Invalid) as e:
            # A restricted identity (--as-given) may not register a policy whose parameter it cannot read; the
            # webhooks serve without it, and the log says so.
            log.warning("policy.unregistered", error=e.message)
        self.registered = True
        log.info("webhooks.registered", url=self.serving.url, policies=[policy.NAME, policy.WEBHOOKS_NAME])

    async def unregister(self) -> None:
        """On exit, what this replica registered (dev mode): another replica's registration is left alone."""
        if self.serving is None or not self.registered:
            return
        registered = (
            (kinds.MUTATING_WEBHOOKS, webhooks.MUTATING_NAME),
            (kinds.VALIDATING_WEBHOOKS, webhooks.CONFIGURATION_NAME),
        )
        for kind, name in registered:
            try:
                await self._kube.delete(kind, name)
            except ApiError as e:
                log.warning("webhooks.unregister_failed", error=e.message)
        log.info("webhooks.unregistered")
