"""§6 through the real API server: VMIs come and go, devices follow, nothing leaks, nothing in use vanishes.

After every scenario the namespace is checked for stale attachments, requests and
template devices.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cozygpu.api import kinds
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import ApiError, Kube
from tests.support.bodies import gpu_device_body, vmi_body
from tests.support.harness import OperatorProcess, wait_for
from tests.support.invariants import stale
from tests.support.nodes import Gpu, GPUNodeFactory
from tests.support.objects import update
from tests.support.operators import start_admitting_operator
from tests.support.webhooks import DENY_LABEL, denying_webhook

pytestmark = pytest.mark.integration

GRACE = 3


@pytest.fixture(scope="module")
def lifecycle_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(tmp_path_factory.mktemp("lifecycle"))


@pytest.fixture(scope="module")
def operator_(operator_kubeconfig: Path, lifecycle_dir: Path) -> Iterator[OperatorProcess]:
    """The whole operator with a short grace period, so collection is visible within a test."""
    process = start_admitting_operator(
        operator_kubeconfig, lifecycle_dir, "--grace-period", str(GRACE), "--sweep-interval", "2", "--bind-timeout", "5"
    )
    yield process
    process.stop()


def clean(kube: Kube, namespace: str) -> None:
    wait_for("nothing stale", lambda: not stale(kube, namespace), timeout=GRACE + 15)


def bound_held(kube: Kube, namespace: str, name: str, cls: str) -> str:
    kube.create(kinds.GPU_DEVICE, gpu_device_body(name, namespace, cls))
    return str(wait_for(f"{name} bound", lambda: status(kube, namespace, name).get("nodeName")))


def status(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = kube.get(kinds.GPU_DEVICE, name, namespace).get("status", {})
    return result


def test_vm_start_stop_cycles_keep_a_held_device_on_its_node(
    operator_: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """Create, delete, create again: the held device stays Bound where it was and is free between runs."""
    gpu_node({gpu.resource: 2}, name=f"cyc-{gpu.cls}")
    node = bound_held(kube, namespace, "h", gpu.cls)
    uids = []
    for _ in range(3):
        vmi = kube.create(kinds.VMI, vmi_body("vm", namespace, [{"device": "h"}]))
        uids.append(vmi["metadata"]["uid"])
        recorded = wait_for("uid recorded", lambda: status(kube, namespace, "h")["attachedTo"].get("uid"))
        assert recorded == vmi["metadata"]["uid"]
        wait_for(
            "protected",
            lambda: (
                "gpu.cozystack.io/in-use-protection"
                in (kube.get(kinds.GPU_DEVICE, "h", namespace)["metadata"].get("finalizers") or [])
            ),
        )
        kube.delete(kinds.VMI, "vm", namespace)
        wait_for("detached", lambda: "attachedTo" not in status(kube, namespace, "h"))
        assert (status(kube, namespace, "h")["phase"], status(kube, namespace, "h")["nodeName"]) == ("Bound", node)
        wait_for("unprotected", lambda: not kube.get(kinds.GPU_DEVICE, "h", namespace)["metadata"].get("finalizers"))
    assert len(set(uids)) == 3
    clean(kube, namespace)


def test_a_vm_restarted_at_once_keeps_its_held_device(
    operator_: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """KubeVirt creates the new VMI the moment the old one is gone, racing the collector's detach (§6.2).

    The new VMI must end up owning the attachment, never lose it to the old VMI's cleanup."""
    gpu_node({gpu.resource: 1}, name=f"restart-{gpu.cls}")
    node = bound_held(kube, namespace, "h", gpu.cls)
    uid = kube.create(kinds.VMI, vmi_body("vm", namespace, [{"device": "h"}]))["metadata"]["uid"]
    for _ in range(8):
        wait_for("attached to the running VMI", lambda: status(kube, namespace, "h").get("attachedTo", {}).get("uid"))
        kube.delete(kinds.VMI, "vm", namespace)
        uid = kube.create(kinds.VMI, vmi_body("vm", namespace, [{"device": "h"}]))["metadata"]["uid"]
        wait_for(
            "the new VMI's uid recorded", lambda u=uid: _attached_uid(kube, namespace, "h") == u, timeout=GRACE + 10
        )
    time.sleep(1)  # the old VMIs' cleanup has had every chance to run
    s = status(kube, namespace, "h")
    assert (s["attachedTo"]["vmi"], s["attachedTo"]["uid"], s["phase"], s["nodeName"]) == ("vm", uid, "Bound", node)
    kube.delete(kinds.VMI, "vm", namespace)
    clean(kube, namespace)


def _attached_uid(kube: Kube, namespace: str, name: str) -> str | None:
    return (status(kube, namespace, name).get("attachedTo") or {}).get("uid")


def test_a_template_device_follows_its_vmi(
    operator_: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """§6.1/§6.2: owned by its VMI once it exists, deleted when the VMI goes."""
    gpu_node({gpu.resource: 2}, name=f"tpl-{gpu.cls}")
    vmi = kube.create(kinds.VMI, vmi_body("vm", namespace, [{"deviceTemplate": {"className": gpu.cls, "count": 2}}]))

    def owner() -> str | None:
        refs = kube.get(kinds.GPU_DEVICE, "vm-gpu-0", namespace)["metadata"].get("ownerReferences") or []
        return refs[0]["uid"] if refs else None

    assert wait_for("owned", owner) == vmi["metadata"]["uid"]
    kube.delete(kinds.VMI, "vm", namespace)
    wait_for("template gone", lambda: kube.get_or_none(kinds.GPU_DEVICE, "vm-gpu-0", namespace) is None)
    clean(kube, namespace)


def test_a_vmi_refused_after_our_answer_leaves_nothing_after_the_grace_period(
    operator_: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory, tmp_path: Path
) -> None:
    """§6.3: a later webhook denies the VMI; the collector clears the attachment and deletes the template."""
    gpu_node({gpu.resource: 2}, name=f"deny-{gpu.cls}")
    bound_held(kube, namespace, "h", gpu.cls)
    refs = [{"device": "h"}, {"deviceTemplate": {"className": gpu.cls, "count": 1}}]
    with denying_webhook(kube, tmp_path), pytest.raises(ApiError, match="denied by the test's second webhook"):
        kube.create(kinds.VMI, vmi_body("vm", namespace, refs, labels={DENY_LABEL: "true"}))
    assert status(kube, namespace, "h")["attachedTo"]["vmi"] == "vm"  # our webhook had answered
    assert kube.get_or_none(kinds.GPU_DEVICE, "vm-gpu-1", namespace) is not None
    wait_for("attachment cleared", lambda: "attachedTo" not in status(kube, namespace, "h"), timeout=GRACE + 10)
    wait_for("template deleted", lambda: kube.get_or_none(kinds.GPU_DEVICE, "vm-gpu-1", namespace) is None)
    assert status(kube, namespace, "h")["phase"] == "Bound"
    clean(kube, namespace)


def test_deleting_an_attached_device_waits_for_the_vmi(
    operator_: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """§6.5: the in-use finalizer holds the device while the VMI exists; it goes when the VMI does."""
    gpu_node({gpu.resource: 2}, name=f"fin-{gpu.cls}")
    bound_held(kube, namespace, "h", gpu.cls)
    kube.create(kinds.VMI, vmi_body("vm", namespace, [{"device": "h"}]))
    wait_for("protected", lambda: kube.get(kinds.GPU_DEVICE, "h", namespace)["metadata"].get("finalizers"))
    kube.delete(kinds.GPU_DEVICE, "h", namespace)
    still = kube.get(kinds.GPU_DEVICE, "h", namespace)
    assert still["metadata"]["deletionTimestamp"]
    assert still["status"]["phase"] == "Bound"
    kube.delete(kinds.VMI, "vm", namespace)
    wait_for("device gone", lambda: kube.get_or_none(kinds.GPU_DEVICE, "h", namespace) is None)
    clean(kube, namespace)


def test_a_class_stays_until_no_device_names_it(
    operator_: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """§6.5: deleting a used class waits; it takes no new orders meanwhile; it goes with its last device."""
    gpu_node({gpu.resource: 2}, name=f"cls-{gpu.cls}")
    bound_held(kube, namespace, "h", gpu.cls)
    wait_for("class protected", lambda: kube.get(kinds.GPU_CLASS, gpu.cls)["metadata"].get("finalizers"))
    kube.delete(kinds.GPU_CLASS, gpu.cls)
    assert kube.get(kinds.GPU_CLASS, gpu.cls)["metadata"]["deletionTimestamp"]
    wait_for("view sees the deletion", lambda: _refused_order(kube, namespace, gpu))
    kube.delete(kinds.GPU_DEVICE, "h", namespace)
    wait_for("class gone", lambda: kube.get_or_none(kinds.GPU_CLASS, gpu.cls) is None)


def _refused_order(kube: Kube, namespace: str, gpu: Gpu) -> bool:
    try:
        kube.create(kinds.GPU_DEVICE, gpu_device_body("late", namespace, gpu.cls), dry_run=True)
    except ApiError as e:
        return "is being deleted and takes no new orders" in e.message
    return False


def test_an_operator_restart_in_the_middle_leaves_nothing_stuck(
    control_plane: ControlPlane,
    operator_: OperatorProcess,
    kube: Kube,
    namespace: str,
    gpu: Gpu,
    gpu_node: GPUNodeFactory,
) -> None:
    """Killed with a VMI running, the VMI deleted while it is down: after restart the sweep detaches and deletes."""
    gpu_node({gpu.resource: 3}, name=f"rs-{gpu.cls}")
    bound_held(kube, namespace, "h", gpu.cls)
    refs = [{"device": "h"}, {"deviceTemplate": {"className": gpu.cls, "count": 1}}]
    kube.create(kinds.VMI, vmi_body("vm", namespace, refs))
    wait_for("recorded", lambda: status(kube, namespace, "h")["attachedTo"].get("uid"))
    operator_.kill()
    kube.delete(kinds.VMI, "vm", namespace)
    operator_.start()
    wait_for("detached", lambda: "attachedTo" not in status(kube, namespace, "h"))
    wait_for("template deleted", lambda: kube.get_or_none(kinds.GPU_DEVICE, "vm-gpu-1", namespace) is None)
    clean(kube, namespace)
    # And the other way round: killed between admission and the VMI's own event.
    operator_.kill()
    operator_.start()
    vmi = kube.create(kinds.VMI, vmi_body("vm2", namespace, [{"device": "h"}]))
    operator_.kill()
    operator_.start()
    assert (
        wait_for("recorded after restart", lambda: status(kube, namespace, "h")["attachedTo"].get("uid"))
        == (vmi["metadata"]["uid"])
    )
    kube.delete(kinds.VMI, "vm2", namespace)
    clean(kube, namespace)


def test_a_refused_vmis_writes_are_cleared_when_the_grace_period_ran_out_while_down(
    operator_: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory, tmp_path: Path
) -> None:
    """§6.3, §6.4: killed right after a later webhook refused the VMI; the restart's sweep clears what it left."""
    gpu_node({gpu.resource: 2}, name=f"down-{gpu.cls}")
    bound_held(kube, namespace, "h", gpu.cls)
    refs = [{"device": "h"}, {"deviceTemplate": {"className": gpu.cls, "count": 1}}]
    with denying_webhook(kube, tmp_path), pytest.raises(ApiError, match="denied by the test's second webhook"):
        kube.create(kinds.VMI, vmi_body("vm", namespace, refs, labels={DENY_LABEL: "true"}))
    operator_.kill()
    assert status(kube, namespace, "h")["attachedTo"]["vmi"] == "vm"
    time.sleep(GRACE + 1)  # the grace period runs out with nobody watching
    operator_.start()
    wait_for("attachment cleared", lambda: "attachedTo" not in status(kube, namespace, "h"))
    wait_for("template deleted", lambda: kube.get_or_none(kinds.GPU_DEVICE, "vm-gpu-1", namespace) is None)
    assert status(kube, namespace, "h")["phase"] == "Bound"
    clean(kube, namespace)


def test_a_deletion_waiting_on_a_vmi_completes_when_the_vmi_went_while_down(
    operator_: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """§6.5: the device waits on its finalizer; the VMI is deleted while the operator is down; after restart it goes."""
    gpu_node({gpu.resource: 2}, name=f"wait-{gpu.cls}")
    bound_held(kube, namespace, "h", gpu.cls)
    kube.create(kinds.VMI, vmi_body("vm", namespace, [{"device": "h"}]))
    wait_for("protected", lambda: kube.get(kinds.GPU_DEVICE, "h", namespace)["metadata"].get("finalizers"))
    kube.delete(kinds.GPU_DEVICE, "h", namespace)
    operator_.kill()
    kube.delete(kinds.VMI, "vm", namespace)
    assert kube.get(kinds.GPU_DEVICE, "h", namespace)["metadata"]["deletionTimestamp"]
    operator_.start()
    wait_for("device gone", lambda: kube.get_or_none(kinds.GPU_DEVICE, "h", namespace) is None)
    clean(kube, namespace)


def test_budget_and_class_status_follow_use(
    operator_: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """§1.4: used and OverBudget when a budget is lowered below what is held (kept); §1.1 class status."""
    gpu_node({gpu.resource: 4}, name=f"use-{gpu.cls}")
    kube.create(
        kinds.GPU_BUDGET,
        {
            "apiVersion": "gpu.cozystack.io/v1alpha1",
            "kind": "GPUBudget",
            "metadata": {"name": "cap", "namespace": namespace},
            "spec": {"limits": {gpu.cls: 3}},
        },
    )
    bound_held(kube, namespace, "a", gpu.cls)
    bound_held(kube, namespace, "b", gpu.cls)

    def budget_used() -> int:
        return int(kube.get(kinds.GPU_BUDGET, "cap", namespace).get("status", {}).get("usedTotal", 0))

    wait_for("used 2", lambda: budget_used() == 2)
    assert kube.get(kinds.GPU_BUDGET, "cap", namespace)["status"]["used"] == {gpu.cls: 2}
    update(kube, kinds.GPU_BUDGET, "cap", lambda b: b["spec"].update(limits={gpu.cls: 1}), namespace)

    def over() -> dict[str, Any] | None:
        conditions = kube.get(kinds.GPU_BUDGET, "cap", namespace).get("status", {}).get("conditions", [])
        return next((c for c in conditions if c["type"] == "OverBudget" and c["status"] == "True"), None)

    assert f"GPUClass {gpu.cls}: 2 used, limit 1" in wait_for("OverBudget", over)["message"]
    assert status(kube, namespace, "a")["phase"] == "Bound"

    def class_free() -> dict[str, Any] | None:
        s = kube.get(kinds.GPU_CLASS, gpu.cls).get("status", {})
        return s if s.get("held") == 2 else None

    cls = wait_for("class status", class_free)
    assert (cls["nodes"], cls["allocatable"], cls["free"]) == ([f"use-{gpu.cls}"], 4, 2)


def test_devices_carry_events_of_what_happened_to_them(
    operator_: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """§10: Bound, Released and Lost Events on the GPUDevice (Lost as a Warning)."""
    node = gpu_node({gpu.resource: 1}, name=f"ev-{gpu.cls}")["metadata"]["name"]
    bound_held(kube, namespace, "h", gpu.cls)
    kube.create(kinds.VMI, vmi_body("vm", namespace, [{"device": "h"}]))
    wait_for("recorded", lambda: status(kube, namespace, "h")["attachedTo"].get("uid"))
    kube.delete(kinds.VMI, "vm", namespace)
    wait_for("detached", lambda: "attachedTo" not in status(kube, namespace, "h"))
    kube.delete(kinds.NODE, node)
    wait_for("lost", lambda: status(kube, namespace, "h").get("phase") == "Lost")

    def reasons() -> set[str]:
        return {e["reason"] for e in kube.list(kinds.kind("Event"), namespace) if e["involvedObject"]["name"] == "h"}

    assert wait_for("events", lambda: {"Bound", "Released", "Lost"} <= reasons() and reasons())
    lost = next(e for e in kube.list(kinds.kind("Event"), namespace) if e["reason"] == "Lost")
    assert (lost["type"], lost["involvedObject"]["kind"]) == ("Warning", "GPUDevice")
