"""Operator processes the tests start against the shared control plane, and the dev webhook registration they leave."""

from __future__ import annotations

import uuid
from pathlib import Path

from cozygpu.api import kinds
from cozygpu.kube.adapter import ApiError, Kube
from cozygpu.runtime.admission import webhooks
from tests.support.bodies import gpu_device_body
from tests.support.harness import OperatorProcess, wait_for

_RUNNING: list[OperatorProcess] = []


def start_operator(kubeconfig: Path, directory: Path, *args: str) -> OperatorProcess:
    """An operator process the node helpers know is running (they then wait until it has seen new nodes)."""
    process = OperatorProcess(kubeconfig, directory / "operator.log", *args).start()
    _RUNNING.append(process)
    return process


def start_admitting_operator(kubeconfig: Path, directory: Path, *extra: str) -> OperatorProcess:
    """The whole operator with webhooks (--dev), as its own identity, so the template-label rule can tell it apart."""
    return start_operator(kubeconfig, directory, "--dev", *extra)


def operator_running() -> bool:
    """Whether an operator started here runs now."""
    return any(p.proc is not None and p.proc.poll() is None for p in _RUNNING)


def unregister_webhooks(kube: Kube) -> None:
    """Delete the dev configurations, then wait until the API server's cache of them has let go too.

    Without the wait, the next writes (a cleanup, the next module's) may still be sent to a dead port.
    """
    kube.delete(kinds.MUTATING_WEBHOOKS, webhooks.MUTATING_NAME)
    kube.delete(kinds.VALIDATING_WEBHOOKS, webhooks.CONFIGURATION_NAME)

    def let_go() -> bool:
        try:
            kube.create(
                kinds.GPU_DEVICE, gpu_device_body(f"probe-{uuid.uuid4().hex[:8]}", "default", "none"), dry_run=True
            )
        except ApiError as e:
            if "failed calling webhook" in e.message:
                return False
            raise
        return True

    wait_for("the API server to stop calling removed webhooks", let_go, timeout=15)
