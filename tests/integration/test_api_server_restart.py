"""The operator outlives its API server (§10; issue 12): an API server restart costs seconds, not a restart."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

from cozygpu.api import kinds
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import Kube
from tests.support import faults
from tests.support.bodies import gpu_device_body
from tests.support.harness import wait_for
from tests.support.nodes import Gpu, GPUNodeFactory
from tests.support.operators import start_operator


def test_the_operator_is_ready_again_soon_after_its_api_server_comes_back(
    control_plane: ControlPlane,
    operator_kubeconfig: Path,
    kube: Kube,
    namespace: str,
    gpu: Gpu,
    gpu_node: GPUNodeFactory,
    tmp_path: Path,
) -> None:
    """kube-apiserver killed and kept down for 8 s: /readyz says a watch is failing while it is down, is 200
    again within seconds of its return (not at the next periodic resync, ten minutes away), with every watch
    listed anew; a device deleted while the API server was down is gone from the view, and a new held device
    binds. Before, a connection error ended the resync task and /readyz failed for good."""
    node = gpu_node({gpu.resource: 2})["metadata"]["name"]
    kube.create(kinds.GPU_DEVICE, gpu_device_body("before", namespace, gpu.cls))
    # A term of 60 s: an 8 s outage must not cost the Lease (two thirds of a term without a renewal would, §10,
    # and then the process rightly ends rather than recovering).
    process = start_operator(
        operator_kubeconfig, tmp_path, "--no-webhooks", "--sweep-interval", "600", "--lease-duration", "60"
    )
    try:
        wait_for(
            "the first device Bound",
            lambda: (kube.get(kinds.GPU_DEVICE, "before", namespace).get("status") or {}).get("nodeName") == node,
        )
        wait_for("the first periodic resync", lambda: process.events("view.resynced")[1:], timeout=20)
        faults.restart_apiserver(control_plane, down=8)
        kube.delete(kinds.GPU_DEVICE, "before", namespace)  # while the operator's watches are still broken
        wait_for("ready again", process.ready, timeout=30)
        assert process.events("watch.failed"), "the outage went unnoticed"
        assert process.events("watch.listed"), "ready again without listing anew"
        assert process.events("task.failed") == []  # the workers lived through it
        kube.create(kinds.GPU_DEVICE, gpu_device_body("after", namespace, gpu.cls, count=2))

        def placed() -> str | None:
            return (kube.get(kinds.GPU_DEVICE, "after", namespace).get("status") or {}).get("nodeName")

        bound = wait_for("the new device Bound on the unit the deleted one freed", placed, timeout=15)
        assert bound == node
    finally:
        process.stop()


def test_the_operator_stops_on_sigterm_while_its_api_server_is_down(
    control_plane: ControlPlane, operator_kubeconfig: Path, tmp_path: Path
) -> None:
    """§10: SIGTERM with no API server to hand the Lease back to: the process still exits, its clean-up steps each
    given up after a few seconds. Before, the Lease's release raised a connection error, kopf retried the
    clean-up every minute, and further SIGTERMs were ignored: the process never ended."""
    process = start_operator(operator_kubeconfig, tmp_path, "--no-webhooks", "--lease-duration", "60")
    exited: list[bool] = []

    def terminate_during_the_outage() -> None:
        time.sleep(2)  # the API server is gone by now
        assert process.proc is not None
        process.proc.send_signal(signal.SIGTERM)
        try:
            process.proc.wait(timeout=15)  # well within the 20 s outage
            exited.append(True)
        except subprocess.TimeoutExpired:
            exited.append(False)

    try:
        wait_for("ready", process.ready, timeout=30)
        wait_for("leading", lambda: process.events("leader.acquired"), timeout=30)
        # The restart runs here, not in a thread: the API server dies with the thread that started it (PDEATHSIG).
        signaller = threading.Thread(target=terminate_during_the_outage)
        signaller.start()
        faults.restart_apiserver(control_plane, down=20)
        signaller.join()
        assert exited == [True] and process.events("operator.stopped")
    finally:
        process.stop()
