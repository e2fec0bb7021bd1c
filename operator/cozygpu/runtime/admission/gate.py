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
from cozygpu.runtime.admission.outcomes import InternalError, Refusal
from cozygpu.runtime.admission.pod_webhook import LauncherAdmission
from cozygpu.runtime.admission.validation import Validation
from cozygpu.runtime.admission.vmi_webhook import VMIAdmission
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
    def _answering(self, webhook: str, checking: str = "it") -> Iterator[None]:
        """The executor's outcome as kopf's answer (a Refusal a 403 the tenant reads, an InternalError a 500 that
        fails closed), and the admission's latency by outcome: allowed, denied or error."""
        started, result = time.monotonic(), "allowed"
        try:
            yield
        except Refusal as e:
            result = "denied"
            raise kopf.AdmissionError(str(e), code=403) from None
        except InternalError as e:
            result = "error"
            raise kopf.AdmissionError(f"the GPU operator could not check {checking}: {e}", code=500) from None
        except kopf.AdmissionError as e:
            result = "denied" if e.code == 403 else "error"
            raise
        except Exception:
            result = "error"
            raise
        finally:
            self._metrics.admission.labels(webhook, result).observe(time.monotonic() - started)

    async def mutate_vmi(self, body: dict[str, Any], patch: kopf.Patch, dry_run: bool) -> None:
        with self._answering(webhooks.VMI_HOOK, "the VMI"):
            admitted = await self._vmis.admit(body, dry_run)
        if admitted is not body:
            patch.fns.append(lambda target: _replace(target, admitted))

    def mutate_pod(self, body: dict[str, Any], patch: kopf.Patch, user: str) -> None:
        with self._answering(webhooks.POD_HOOK):
            if not self._synced():
                # Decided from the view alone: none yet, so fail closed and let KubeVirt retry.
                raise kopf.AdmissionError("the GPU operator has not synced its view yet", code=500)
            admitted = self._launchers.admit(body, user)
        if admitted is not body:
            patch.fns.append(lambda target: _replace(target, admitted))

    async def validate_device(
        self, operation: str, new: dict[str, Any] | None, old: dict[str, Any] | None, user: str, dry_run: bool
    ) -> None:
        with self._answering(webhooks.DEVICE_HOOK):
            await self._validation.device(operation, new, old, user, dry_run, review=webhooks.REVIEW_UID.get())

    def validate_class(self, operation: str, new: dict[str, Any] | None, old: dict[str, Any] | None) -> None:
        with self._answering(webhooks.CLASS_HOOK):
            self._validation.gpu_class(operation, new, old)

    def validate_budget(self, new: dict[str, Any] | None, warnings: list[str]) -> None:
        with self._answering(webhooks.BUDGET_HOOK):
            self._validation.budget(new, warnings)


def _replace(target: Any, admitted: dict[str, Any]) -> None:
    target.clear()
    target.update(copy.deepcopy(admitted))
