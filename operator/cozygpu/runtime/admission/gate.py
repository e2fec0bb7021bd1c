"""The admission gate: what kopf's webhook handlers (runtime.process.handlers) call.

Each call runs its executor (the VMI webhook, the launcher pod webhook, validation),
turns its outcome into kopf's answer (a refusal is a 403 the tenant reads, a failure
of the API a 500 that fails closed) and observes its latency by outcome.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator
from typing import Any

import kopf

from cozygpu.runtime.admission import webhooks
from cozygpu.runtime.admission.pod_webhook import LauncherAdmission, PodRefused
from cozygpu.runtime.admission.validation import Denied, Validation
from cozygpu.runtime.admission.vmi_webhook import InternalError, Refusal, VMIAdmission
from cozygpu.runtime.metrics import Metrics


class Gate:
    def __init__(
        self,
        vmis: VMIAdmission,
        launchers: LauncherAdmission,
        validation: Validation,
        metrics: Metrics,
        synced: Callable[[], bool],
    ) -> None:
        self._vmis = vmis
        self._launchers = launchers
        self._validation = validation
        self._metrics = metrics
        self._synced = synced

    @contextlib.contextmanager
    def _timed(self, webhook: str) -> Iterator[None]:
        """Observe the admission's latency by outcome: allowed, denied (403) or error."""
        started, result = time.monotonic(), "allowed"
        try:
            yield
        except kopf.AdmissionError as e:
            result = "denied" if e.code == 403 else "error"
            raise
        except Exception:
            result = "error"
            raise
        finally:
            self._metrics.admission.labels(webhook, result).observe(time.monotonic() - started)

    async def mutate_vmi(self, body: dict[str, Any], patch: kopf.Patch, dry_run: bool) -> None:
        with self._timed(webhooks.VMI_HOOK):
            try:
                admitted = await self._vmis.admit(body, dry_run)
            except Refusal as e:
                raise kopf.AdmissionError(str(e), code=403) from None
            except InternalError as e:
                raise kopf.AdmissionError(f"the GPU operator could not check the VMI: {e}", code=500) from None
        if admitted is not body:
            patch.fns.append(lambda target: _replace(target, admitted))

    def mutate_pod(self, body: dict[str, Any], patch: kopf.Patch, user: str) -> None:
        with self._timed(webhooks.POD_HOOK):
            if not self._synced():
                # Decided from the view alone: none yet, so fail closed and let KubeVirt retry.
                raise kopf.AdmissionError("the GPU operator has not synced its view yet", code=500)
            try:
                admitted = self._launchers.admit(body, user)
            except PodRefused as e:
                raise kopf.AdmissionError(str(e), code=403) from None
        if admitted is not body:
            patch.fns.append(lambda target: _replace(target, admitted))

    async def validate_device(
        self, operation: str, new: dict[str, Any] | None, old: dict[str, Any] | None, user: str, dry_run: bool
    ) -> None:
        with self._timed(webhooks.DEVICE_HOOK):
            try:
                await self._validation.device(operation, new, old, user, dry_run, review=webhooks.REVIEW_UID.get())
            except Denied as e:
                raise kopf.AdmissionError(str(e), code=403) from None

    def validate_class(self, operation: str, new: dict[str, Any] | None, old: dict[str, Any] | None) -> None:
        with self._timed(webhooks.CLASS_HOOK):
            try:
                self._validation.gpu_class(operation, new, old)
            except Denied as e:
                raise kopf.AdmissionError(str(e), code=403) from None

    def validate_budget(self, new: dict[str, Any] | None, warnings: list[str]) -> None:
        with self._timed(webhooks.BUDGET_HOOK):
            try:
                self._validation.budget(new, warnings)
            except Denied as e:
                raise kopf.AdmissionError(str(e), code=403) from None


def _replace(target: Any, admitted: dict[str, Any]) -> None:
    target.clear()
    target.update(copy.deepcopy(admitted))
