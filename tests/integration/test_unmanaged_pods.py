"""Units held behind the operator's back (§12, §1.3): seen on the GPUNode, and not given to a held device."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cozygpu.api import kinds
from cozygpu.kube.adapter import ApiError, Body, Kube
from tests.support.bodies import gpu_class_body, gpu_device_body
from tests.support.harness import OperatorProcess, logged, wait_for
from tests.support.nodes import Gpu, GPUNodeFactory, fresh_gpu
from tests.support.operators import start_admitting_operator


def holding_pod(name: str, namespace: str, node: str, asks: dict[str, int], vmi: str | None = None) -> Body:
    """A pod already placed on `node` (as kube-scheduler or a person's nodeName would), asking for `asks`."""
    resources = {r: str(n) for r, n in asks.items()}
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if vmi is not None:  # what virt-controller renders: its label, the VMI as controller
        meta["labels"] = {"kubevirt.io": "virt-launcher"}
        meta["ownerReferences"] = [
            {
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachineInstance",
                "name": vmi,
                "uid": str(uuid.uuid4()),
                "controller": True,
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "c", "image": "registry.invalid/x", "resources": {"requests": resources, "limits": resources}}
            ],
        },
    }


def end(kube: Kube, name: str, namespace: str, phase: str = "Succeeded") -> None:
    """The pod finishes, as its kubelet would report (no kubelet runs here to delete it)."""
    body = kube.get(kinds.POD, name, namespace)
    body["status"] = {**(body.get("status") or {}), "phase": phase}
    kube.replace_status(kinds.POD, body)


def unmanaged(kube: Kube, node: str, resource: str) -> tuple[int, list[dict[str, Any]]]:
    """The GPUNode's unmanaged units of `resource`, and the pods it names."""
    status = (kube.get_or_none(kinds.GPU_NODE, node) or {}).get("status") or {}
    units = next((r.get("unmanaged", 0) for r in status.get("resources", []) if r["name"] == resource), 0)
    return units, status.get("unmanagedPods", [])


# A namespace §12 does not guard, by name (the operator's --exempt-namespace, the chart's list).
EXEMPT = f"exempt-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def quick(operator_kubeconfig: Path, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The whole operator, re-reading the pods it found every 2 s."""
    process = start_admitting_operator(
        operator_kubeconfig, tmp_path, "--sweep-interval", "2", "--bind-timeout", "5", "--exempt-namespace", EXEMPT
    )
    yield process
    process.stop()


def test_a_pod_that_predates_the_guard_shows_on_its_node_and_takes_no_held_units(
    operator_kubeconfig: Path, kube: Kube, namespace: str, gpu_node: GPUNodeFactory, tmp_path: Path
) -> None:
    """A pod asking for a resource before any class manages it (so before the policy guards it), is found by the
    start-up list: the GPUNode names it with its units, LostCapacity stays False while nothing is crowded, and
    the binder does not hand its unit to a held device; when it ends, the unit is free again."""
    gpu = fresh_gpu()
    node = gpu_node({gpu.resource: 2})["metadata"]["name"]
    # No class names the resource yet: whatever policy an earlier test left, it lets the pod in.
    kube.create(kinds.POD, holding_pod("old-job", namespace, node, {gpu.resource: 1}))
    kube.create(kinds.GPU_CLASS, gpu_class_body(gpu.cls, gpu.resource))
    process = start_admitting_operator(operator_kubeconfig, tmp_path, "--sweep-interval", "2")
    try:
        units, pods = wait_for(
            "the old pod on the GPUNode", lambda: (u := unmanaged(kube, node, gpu.resource))[0] and u, timeout=30
        )
        assert units == 1
        assert pods == [{"pod": f"{namespace}/old-job", "units": {gpu.resource: 1}}]
        status = kube.get(kinds.GPU_NODE, node)["status"]
        assert next(r for r in status["resources"] if r["name"] == gpu.resource)["free"] == 1
        kube.create(kinds.GPU_DEVICE, gpu_device_body("pair", namespace, gpu.cls, count=2))

        def waiting() -> str | None:
            st = kube.get(kinds.GPU_DEVICE, "pair", namespace).get("status") or {}
            return st.get("message") if st.get("phase") == "Pending" else None

        assert f"no node has 2 free units of {gpu.resource}" in wait_for("the pair waiting", waiting)
        why = f"node {node} has 1 free of {gpu.resource}, needs 2"
        assert logged(process, "device.waiting", lambda e: e.get("device") == "pair" and why in (e.get("detail") or ""))
        end(kube, "old-job", namespace)
        wait_for("the unit back", lambda: unmanaged(kube, node, gpu.resource) == (0, []), timeout=20)
        bound = wait_for(
            "the pair Bound",
            lambda: (
                (kube.get(kinds.GPU_DEVICE, "pair", namespace).get("status") or {}).get("phase") == "Bound"
                and kube.get(kinds.GPU_DEVICE, "pair", namespace)
            ),
        )
        assert bound["status"]["nodeName"] == node
    finally:
        process.stop()
        kube.delete(kinds.GPU_DEVICE, "pair", namespace)
        wait_for("pair gone", lambda: kube.get_or_none(kinds.GPU_DEVICE, "pair", namespace) is None)
        kube.delete(kinds.GPU_CLASS, gpu.cls)


def test_a_launcher_the_operator_did_not_admit_is_watched_in_and_out(
    quick: OperatorProcess, kube: Kube, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """In a namespace exempt from §12, a launcher pod of a VMI the operator never admitted passes the pod
    webhook untouched, and the launcher watch shows it on the GPUNode at once, with its VMI, and takes it off
    when it fails; crowding a held device's units raises LostCapacity (UnmanagedPods) meanwhile."""
    namespace = EXEMPT
    meta = {"name": namespace}
    kube.create(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": meta})
    node = gpu_node({gpu.resource: 2})["metadata"]["name"]
    kube.create(kinds.GPU_DEVICE, gpu_device_body("held", namespace, gpu.cls, count=2))
    wait_for(
        "the held device Bound",
        lambda: (kube.get(kinds.GPU_DEVICE, "held", namespace).get("status") or {}).get("nodeName") == node,
    )
    launcher = holding_pod("virt-launcher-stray", namespace, node, {gpu.resource: 1}, vmi="stray")

    def created() -> Body | None:
        try:  # the API server applies the operator's new binding a moment after it is registered
            return kube.create(kinds.POD, launcher)
        except ApiError as e:
            if e.status != 403:
                raise
            return None

    pod = wait_for("the stray launcher admitted", created)
    assert pod["spec"].get("affinity") is None  # untouched: no set of the operator's to pin it to
    units, pods = wait_for("the launcher on the GPUNode", lambda: (u := unmanaged(kube, node, gpu.resource))[0] and u)
    assert (units, pods) == (
        1,
        [{"pod": f"{namespace}/virt-launcher-stray", "vmi": "stray", "units": {gpu.resource: 1}}],
    )

    def lost() -> dict[str, Any] | None:
        conditions = (kube.get(kinds.GPU_NODE, node).get("status") or {}).get("conditions", [])
        return next((c for c in conditions if c["type"] == "LostCapacity" and c["status"] == "True"), None)

    condition = wait_for("LostCapacity", lost)
    assert condition["reason"] == "UnmanagedPods" and f"{namespace}/virt-launcher-stray" in condition["message"]
    end(kube, "virt-launcher-stray", namespace, phase="Failed")
    wait_for("the launcher gone from the GPUNode", lambda: unmanaged(kube, node, gpu.resource) == (0, []), timeout=10)
    wait_for("capacity intact again", lambda: lost() is None, timeout=10)


def test_a_launcher_relabelled_or_unlabelled_is_still_followed_until_it_ends(
    quick: OperatorProcess, kube: Kube, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """Issue 34 item 1: a launcher whose `kubevirt.io` label is changed stays a launcher of its VMI on the GPUNode
    (KubeVirt tells its pods by the VMI controller reference); one whose label is removed leaves the launcher
    watch's selection, is read fresh rather than forgotten, and is read again every sweep until it ends. Before,
    the relabelled pod left the view at once, so its guest counted as gone. Where the no-bypass policy does not
    refuse the relabel (an exempt namespace here; a platform without the policy)."""
    namespace = EXEMPT
    if kube.get_or_none(kinds.NAMESPACE, namespace) is None:
        kube.create(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    node = gpu_node({gpu.resource: 2})["metadata"]["name"]
    name = "virt-launcher-relabelled"

    def created() -> Body | None:
        try:  # the API server applies the operator's new binding a moment after it is registered
            return kube.create(kinds.POD, holding_pod(name, namespace, node, {gpu.resource: 1}, vmi="relabelled"))
        except ApiError as e:
            if e.status != 403:
                raise
            return None

    wait_for("the launcher admitted", created)
    followed = (1, [{"pod": f"{namespace}/{name}", "vmi": "relabelled", "units": {gpu.resource: 1}}])
    wait_for("the launcher on the GPUNode", lambda: unmanaged(kube, node, gpu.resource) == followed)
    kube.patch(kinds.POD, name, {"metadata": {"labels": {"kubevirt.io": "x"}}}, namespace)
    time.sleep(2)  # the watch's event has come, and a sweep's re-read
    assert unmanaged(kube, node, gpu.resource) == followed
    kube.patch(kinds.POD, name, {"metadata": {"labels": {"kubevirt.io": None}}}, namespace)
    time.sleep(3)  # out of the launcher watch's selection: its DELETED event, then re-reads every sweep
    assert unmanaged(kube, node, gpu.resource) == followed
    end(kube, name, namespace, phase="Failed")
    wait_for("the ended launcher gone", lambda: unmanaged(kube, node, gpu.resource) == (0, []), timeout=15)
