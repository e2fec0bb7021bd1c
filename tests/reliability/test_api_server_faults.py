"""The API server frozen, and watches resumed from a compacted version (issue 12 item 4).

Frozen: kube-apiserver stopped (SIGSTOP) in the middle of admissions and let go again.
Compacted: the operator is stopped (SIGSTOP) until the API server has ended its watch streams
(a short `--watch-timeout`), then the API server restarts, objects change and etcd is
compacted past every version those watches knew; let go, the operator resumes each watch
from its last version and is answered 410 Gone: the restarted API server's watch cache
starts after that version, and etcd no longer has it either. It lists the kind anew. In
both, the time from the fault's end to the operator ready and binding a new device is
recorded; `make soak` repeats them.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from pathlib import Path

import pytest

from cozygpu.api import kinds
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import ApiError, Kube
from tests.support import faults
from tests.support.bodies import gpu_device_body, vmi_body
from tests.support.harness import wait_for
from tests.support.invariants import admitting, settled
from tests.support.nodes import Gpu, GPUNodeFactory
from tests.support.objects import update
from tests.support.operators import start_admitting_operator
from tests.support.soak import TALLY, Budget, runs

# A 60 s term: the faults here last seconds, and must not cost the Lease (that ends the process, §10). A grace
# period longer than the freeze: a create the API server admitted may be stored only once it is let go, and
# the grace period is what the collector allows for that (§6.3; 120 s by default, beyond a request's timeout).
STREAM = 3  # seconds the API server holds a watch stream, in the compaction scenario
SETTINGS = ("--grace-period", "10", "--sweep-interval", "1", "--bind-timeout", "4", "--lease-duration", "60")


def _binds(kube: Kube, namespace: str, name: str, gpu: Gpu) -> float:
    """Seconds until a new held device is Bound: the operator is working again, not only ready."""
    start = time.monotonic()
    kube.create(kinds.GPU_DEVICE, gpu_device_body(name, namespace, gpu.cls))
    wait_for(
        f"{name} Bound",
        lambda: (kube.get(kinds.GPU_DEVICE, name, namespace).get("status") or {}).get("phase") == "Bound",
        timeout=60,
    )
    kube.delete(kinds.GPU_DEVICE, name, namespace)
    return time.monotonic() - start


@pytest.mark.timeout(0)
def test_a_frozen_api_server_in_the_middle_of_admissions_leaves_nothing_broken(
    control_plane: ControlPlane,
    operator_kubeconfig: Path,
    kube: Kube,
    namespace: str,
    gpu: Gpu,
    gpu_node: GPUNodeFactory,
    tmp_path: Path,
) -> None:
    """kube-apiserver frozen for 6 s while VMIs are being admitted: afterwards every invariant holds, the operator
    is ready and binds a new device; the recovery time is recorded."""
    gpu_node({gpu.resource: 8}, name=f"frozen-{gpu.cls}")
    record = TALLY["API server frozen"]
    operator = start_admitting_operator(operator_kubeconfig, tmp_path, *SETTINGS)
    budget = Budget("API server frozen")
    hits = 0
    try:
        # A burst may end before the freeze lands; such a run counts, and a few more are made until one lands.
        for n in range(runs(1, 20) + 4):
            if not budget.left() or (record.runs >= runs(1, 20) and hits):
                break
            threads = [threading.Thread(target=_create, args=(kube, namespace, f"vm{n}-{i}", gpu)) for i in range(4)]
            for t in threads:
                t.start()
            admitting(kube, namespace, f"vm{n}-")  # freeze while an admission is under way
            in_flight = sum(t.is_alive() for t in threads)
            faults.freeze_apiserver(control_plane, 6)
            thawed = time.monotonic()
            wait_for("ready after the freeze", operator.ready, timeout=60)
            for t in threads:
                t.join(timeout=60)
            _binds(kube, namespace, f"probe-{n}", gpu)
            record.recoveries.append(time.monotonic() - thawed)
            settled(kube, namespace, operator, record, f"freeze {n}")
            for vmi in kube.list(kinds.VMI, namespace):
                kube.delete(kinds.VMI, vmi["metadata"]["name"], namespace)
            settled(kube, namespace, operator, record, f"freeze {n}, its VMIs deleted")
            record.runs += 1
            hits += in_flight > 0
        record.note = f"{hits} of {record.runs} freezes with creates in flight"
        assert hits > 0, "no freeze landed while a create was in flight"
        assert operator.healthy()
    finally:
        operator.stop()
    assert record.violations == []


@pytest.mark.timeout(0)
def test_watches_resumed_from_a_compacted_version_list_anew(
    control_plane: ControlPlane,
    operator_kubeconfig: Path,
    kube: Kube,
    namespace: str,
    gpu: Gpu,
    gpu_node: GPUNodeFactory,
    tmp_path: Path,
) -> None:
    """The operator stopped until its watch streams ended, while the API server restarts, devices change and
    etcd is compacted: let go, its watches resume, get 410 Gone and list anew (`watch.expired`), a device
    deleted meanwhile is released, a new one is bound, and every invariant holds; the recovery is recorded."""
    node = gpu_node({gpu.resource: 4}, name=f"compacted-{gpu.cls}")["metadata"]["name"]
    record = TALLY["watches resumed after etcd compaction"]
    operator = start_admitting_operator(operator_kubeconfig, tmp_path, *SETTINGS, "--watch-timeout", str(STREAM))
    budget = Budget("watches resumed after etcd compaction")
    try:
        for n in range(runs(1, 20)):
            if not budget.left():
                break
            expired = len(operator.events("watch.expired"))
            kube.create(kinds.GPU_DEVICE, gpu_device_body(f"old-{n}", namespace, gpu.cls))
            wait_for(
                "old Bound",
                lambda n=n: (
                    (kube.get(kinds.GPU_DEVICE, f"old-{n}", namespace).get("status") or {}).get("phase") == "Bound"
                ),
            )
            assert operator.proc is not None
            operator.proc.send_signal(signal.SIGSTOP)
            try:
                time.sleep(STREAM + 1)  # every stream ended by the server, none failed: each resumes, not relists
                faults.restart_apiserver(control_plane)
                # Ready, but its caches of our kinds may still be filling: "storage is (re)initializing".
                wait_for("our kinds served", lambda: _serves(kube, namespace))
                # Changes the operator misses; a create would need its webhook, which is stopped too.
                kube.delete(kinds.GPU_DEVICE, f"old-{n}", namespace)
                update(kube, kinds.NODE, node, lambda b, n=n: b["metadata"]["labels"].update({"round": str(n)}))
                faults.compact_etcd(control_plane)
            finally:
                operator.proc.send_signal(signal.SIGCONT)
            thawed = time.monotonic()
            wait_for("old gone", lambda n=n: kube.get_or_none(kinds.GPU_DEVICE, f"old-{n}", namespace) is None)
            kube.create(kinds.GPU_DEVICE, gpu_device_body(f"new-{n}", namespace, gpu.cls))
            wait_for(
                "new Bound",
                lambda n=n: (
                    (kube.get(kinds.GPU_DEVICE, f"new-{n}", namespace).get("status") or {}).get("phase") == "Bound"
                ),
                timeout=60,
            )
            wait_for("ready after the compaction", operator.ready, timeout=60)
            record.recoveries.append(time.monotonic() - thawed)
            assert len(operator.events("watch.expired")) > expired, "no watch was answered 410 Gone"
            settled(kube, namespace, operator, record, f"compaction {n}")
            kube.delete(kinds.GPU_DEVICE, f"new-{n}", namespace)
            record.runs += 1
    finally:
        operator.stop()
    assert record.violations == []


def _serves(kube: Kube, namespace: str) -> bool:
    try:
        return all(
            kube.list(kind, namespace if kind.namespaced else None) is not None
            for kind in (kinds.GPU_DEVICE, kinds.GPU_CLASS, kinds.GPU_BUDGET, kinds.GPU_NODE, kinds.NODE)
        )
    except ApiError:
        return False


def _create(kube: Kube, namespace: str, name: str, gpu: Gpu) -> None:
    refs = [{"deviceTemplate": {"className": gpu.cls, "count": 1}}]
    with contextlib.suppress(ApiError):  # refused or timed out while frozen: fail closed
        kube.create(kinds.VMI, vmi_body(name, namespace, refs))
