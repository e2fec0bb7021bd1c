"""The GPUDevice, GPUClass and GPUBudget validating webhooks (§9): executors around the pure checks.

A held-device create is checked and reserved with no await in between, and stays reserved
until the view sees it, so concurrent creates cannot together pass a budget (§7.4); across replicas
each admission is also charged to the budgets that can refuse it (runtime.charges), whose
resourceVersions serialise them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from cozygpu.api import GPUBudget, GPUClass, GPUDevice, kinds
from cozygpu.api.kinds import Kind
from cozygpu.decisions import validation
from cozygpu.decisions.orders import Order
from cozygpu.runtime.admission.outcomes import Refusal
from cozygpu.runtime.admission.reservations import Reservations
from cozygpu.runtime.charges import Charges
from cozygpu.state.cluster import Cluster

log = structlog.get_logger("cozygpu.webhook")


class Validation:
    def __init__(
        self,
        cluster: Cluster,
        reservations: Reservations,
        *,
        budgets_required: bool = False,
        exists: Callable[[Kind, str, str], Awaitable[bool]] | None = None,
        charges: Charges | None = None,
    ) -> None:
        self._cluster = cluster
        # A fresh read into the view (kind, namespace, name): whether the object exists now. The view may still
        # hold a GPUDevice deleted a moment ago, or not yet hold a GPUClass created a moment ago (one manifest
        # applied at once), and a create must not be refused for either.
        self._exists = exists
        self._reservations = reservations
        self._charges = charges  # None: one replica only (tests), its reservations are the whole story
        self._budgets_required = budgets_required
        self.operator_user = ""  # learned at start-up (SelfSubjectReview)

    async def device(
        self,
        operation: str,
        new: dict[str, Any] | None,
        old: dict[str, Any] | None,
        user: str,
        dry_run: bool,
        *,
        review: str = "",
    ) -> None:
        """§9.1-§9.3 for a GPUDevice; `review` is the AdmissionReview's uid, which a held order is reserved under."""
        if operation == "CREATE" and new is not None:
            device = GPUDevice.from_wire(new)
            if device.spec.class_name not in self._cluster.classes and self._exists is not None:
                await self._exists(kinds.GPU_CLASS, "", device.spec.class_name)  # §9: read fresh before refusing
            namespace, held = device.namespace or "", not device.carries_template_label
            # Checked and reserved with no await between (§7.4): a create admitted meanwhile counts this one, and
            # its confirmation below (a name's read, the budgets' charges) waits on no other tenant's (§14).
            problem = validation.device_create(
                self._cluster,
                device,
                user,
                self.operator_user,
                self._reservations.prior(),
                budgets_required=self._budgets_required,
            )
            if problem is None and held and self._reservations.holds(namespace, device.name):
                problem = self._duplicate(device)
            order = Order(namespace, device.spec.class_name, device.spec.count, device.name)
            key = None
            if problem is None and held and not dry_run:
                # Reserved before any await: the binder decides on this event loop meanwhile, and must count it.
                key = self._reservations.add(
                    namespace, device.name, order, review=review, uid=device.metadata.uid or ""
                )
            try:
                problem = problem or await self._confirm(device, user, order, key)
            except BaseException:
                # Not admitted (the API server fails the create closed): the order must not count here either.
                if key is not None:
                    self._reservations.cancel(key)
                raise
            if key is not None and problem is not None:
                self._reservations.cancel(key)
        elif operation == "UPDATE" and new is not None and old is not None:
            problem = validation.device_update(
                GPUDevice.from_wire(old), GPUDevice.from_wire(new), user, self.operator_user
            )
        else:
            return
        self._answer("gpudevice", new or old or {}, problem)

    def _check(self, device: GPUDevice, user: str, key: str) -> Callable[[list[Order]], str | None]:
        """§9.1 for the create, with this replica's other reservations and other replicas' orders as prior orders."""
        return lambda others: validation.device_create(
            self._cluster,
            device,
            user,
            self.operator_user,
            [*self._reservations.prior(excluding=key), *others],
            budgets_required=self._budgets_required,
        )

    async def _confirm(self, device: GPUDevice, user: str, order: Order, key: str | None) -> str | None:
        """What needs the API for a held create that passed the view's checks: that its name is free (the view may
        hold a device deleted a moment ago), and, across replicas, its charge to its budgets (§7.4, §10)."""
        namespace = device.namespace or ""
        if device.carries_template_label:
            return None
        if self._cluster.devices.get((namespace, device.name)) is not None and (
            self._exists is None or await self._exists(kinds.GPU_DEVICE, namespace, device.name)
        ):
            # The API server would answer AlreadyExists after admission: its order must not count.
            return self._duplicate(device)
        if key is None or self._charges is None:
            return None
        claims = {(namespace, device.name, device.metadata.uid or ""): order}
        return await self._charges.charge(namespace, claims, self._check(device, user, key))

    @staticmethod
    def _duplicate(device: GPUDevice) -> str:
        return f"GPUDevice {device.name} already exists in namespace {device.namespace}, or is being created"

    def gpu_class(self, operation: str, new: dict[str, Any] | None, old: dict[str, Any] | None) -> None:
        if operation != "UPDATE" or new is None or old is None:
            return
        problem = validation.class_update(self._cluster, GPUClass.from_wire(old), GPUClass.from_wire(new))
        self._answer("gpuclass", new, problem)

    def budget(self, new: dict[str, Any] | None, warnings: list[str]) -> None:
        if new is None:
            return
        problem, notes = validation.budget_warnings(self._cluster, GPUBudget.from_wire(new))
        warnings.extend(notes)
        self._answer("gpubudget", new, problem)

    @staticmethod
    def _answer(kind: str, body: dict[str, Any], problem: str | None) -> None:
        if problem is None:
            return
        meta = body.get("metadata", {})
        log.info(f"{kind}.refused", namespace=meta.get("namespace"), name=meta.get("name"), reason=problem)
        raise Refusal(problem)
