"""The binder in the operator process, through the real API server (§4, §5).

Requests are written the way §4 says the webhook writes them. Every test has its
own resource name and class, so other tests' nodes never compete for its units.
"""

from __future__ import annotations

import concurrent.futures
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cozygpu.api import kinds
from cozygpu.devcluster import nodes
from cozygpu.kube.adapter import Body, Kube
from tests.support.bodies import gpu_class_body, gpu_device_body
from tests.support.harness import (
    OperatorProcess,
    answer_of,
    logged,
    template_device,
    wait_for,
    write_request,
)
from tests.support.nodes import Gpu, GPUNodeFactory, wait_until_accounted
from tests.support.operators import start_operator
from tests.support.seen import budget_seen

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def operator(operator_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """The operator without webhooks, resyncing its view only at start and 5 s in (then every ten minutes)."""
    process = start_operator(
        operator_kubeconfig, tmp_path_factory.mktemp("binder"), "--no-webhooks", "--sweep-interval", "600"
    )
    yield process
    process.stop()


def status(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = kube.get(kinds.GPU_DEVICE, name, namespace).get("status", {})
    return result


def result_of(body: Body) -> str:
    return str(body["status"]["bindRequest"]["result"])


def bound_on(kube: Kube, namespace: str, name: str) -> str | None:
    s = status(kube, namespace, name)
    return s.get("nodeName") if s.get("phase") == "Bound" else None


def test_a_two_device_set_is_placed_on_one_node(
    operator: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """Both devices Bound on the one node with room for both; the answer is Succeeded on each."""
    gpu_node({gpu.resource: 1}, name=f"small-{gpu.cls}")
    big = gpu_node({gpu.resource: 2}, name=f"big-{gpu.cls}")["metadata"]["name"]
    for name in ("vm-gpu-0", "vm-gpu-1"):
        template_device(kube, namespace, name, gpu.cls)
    rid = write_request(kube, namespace, ["vm-gpu-0", "vm-gpu-1"], "vm")
    answered = answer_of(kube, namespace, ["vm-gpu-0", "vm-gpu-1"], rid)
    assert [result_of(b) for b in answered] == ["Succeeded", "Succeeded"]
    assert {b["status"]["nodeName"] for b in answered} == {big}
    assert {b["status"]["phase"] for b in answered} == {"Bound"}


def test_a_set_is_gathered_from_two_nodes(
    operator: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """§5.3: held devices on two nodes move together onto the one that can take the set."""
    n1 = gpu_node({gpu.resource: 1}, name=f"a-{gpu.cls}")["metadata"]["name"]
    n2 = gpu_node({gpu.resource: 1}, name=f"b-{gpu.cls}")["metadata"]["name"]
    kube.create(kinds.GPU_DEVICE, gpu_device_body("first", namespace, gpu.cls))
    wait_for("first bound", lambda: bound_on(kube, namespace, "first"))
    kube.create(kinds.GPU_DEVICE, gpu_device_body("second", namespace, gpu.cls))
    wait_for("second bound", lambda: bound_on(kube, namespace, "second"))
    assert {bound_on(kube, namespace, "first"), bound_on(kube, namespace, "second")} == {n1, n2}
    stays = bound_on(kube, namespace, "first")
    nodes.set_gpus(kube, stays or "", {gpu.resource: 2})  # room for the other one there
    wait_until_accounted(kube, stays or "", {gpu.resource: 2}, {})
    rid = write_request(kube, namespace, ["first", "second"], "vm")
    answered = answer_of(kube, namespace, ["first", "second"], rid)
    assert [result_of(b) for b in answered] == ["Succeeded", "Succeeded"]
    assert {b["status"]["nodeName"] for b in answered} == {stays}
    moved = logged(operator, "bind.answered", lambda e: e["request_id"] == rid)
    assert moved[0]["moved"] == ["second"]


def test_a_set_no_node_can_take_fails_and_moves_nothing(
    operator: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """The answer is Failed with a message naming the resource; held and template devices stay as they were."""
    n1 = gpu_node({gpu.resource: 1}, name=f"a-{gpu.cls}")["metadata"]["name"]
    kube.create(kinds.GPU_DEVICE, gpu_device_body("held", namespace, gpu.cls))
    wait_for("held bound", lambda: bound_on(kube, namespace, "held"))
    template_device(kube, namespace, "vm-gpu-1", gpu.cls, 2)
    rid = write_request(kube, namespace, ["held", "vm-gpu-1"], "vm")
    answered = answer_of(kube, namespace, ["held", "vm-gpu-1"], rid)
    assert [result_of(b) for b in answered] == ["Failed", "Failed"]
    message = answered[0]["status"]["bindRequest"]["message"]
    assert f"free units of {gpu.resource}" in message
    assert f"GPUClass {gpu.cls}" in message
    assert bound_on(kube, namespace, "held") == n1
    assert "phase" not in status(kube, namespace, "vm-gpu-1")


def test_taints_cordon_not_ready_and_node_selector_are_respected(
    operator: OperatorProcess, kube: Kube, namespace: str, gpu_node: GPUNodeFactory
) -> None:
    """§5.1: only the Ready, schedulable, labelled node whose taints the class tolerates is chosen."""
    tag = uuid.uuid4().hex[:6]
    resource, cls = f"example.com/gpu-{tag}", f"cls-{tag}"
    kube.create(
        kinds.GPU_CLASS,
        gpu_class_body(
            cls,
            resource,
            nodeSelector={"pool": tag},
            tolerations=[{"key": "gpu-only", "operator": "Exists", "effect": "NoSchedule"}],
        ),
    )
    labels = {"pool": tag}
    gpu_node({resource: 8}, labels=labels, name=f"a-notready-{tag}", ready=False)
    gpu_node({resource: 8}, labels=labels, name=f"b-cordoned-{tag}", unschedulable=True)
    gpu_node(
        {resource: 8},
        labels=labels,
        name=f"c-tainted-{tag}",
        taints=[{"key": "other", "value": "x", "effect": "NoExecute"}],
    )
    gpu_node({resource: 8}, name=f"d-unlabelled-{tag}")
    good = gpu_node(
        {resource: 1},
        labels=labels,
        name=f"e-good-{tag}",
        taints=[{"key": "gpu-only", "value": "", "effect": "NoSchedule"}],
    )
    template_device(kube, namespace, "vm-gpu-0", cls)
    rid = write_request(kube, namespace, ["vm-gpu-0"], "vm")
    [answered] = answer_of(kube, namespace, ["vm-gpu-0"], rid)
    assert result_of(answered) == "Succeeded"
    assert answered["status"]["nodeName"] == good["metadata"]["name"]
    kube.delete(kinds.GPU_CLASS, cls)


def test_concurrent_requests_never_spend_a_unit_twice(
    operator: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """20 requests for 12 units on two nodes: 12 win, 8 are Failed, and no node holds more than it has."""
    sizes = {f"a-{gpu.cls}": 5, f"b-{gpu.cls}": 7}
    for name, units in sizes.items():
        gpu_node({gpu.resource: units}, name=name)
    names = [f"vm{i}-gpu-0" for i in range(20)]
    for name in names:
        template_device(kube, namespace, name, gpu.cls)
    with concurrent.futures.ThreadPoolExecutor(max_workers=10) as pool:
        ids = list(pool.map(lambda n: write_request(kube, namespace, [n], n.removesuffix("-gpu-0")), names))
    answers = [answer_of(kube, namespace, [n], rid)[0] for n, rid in zip(names, ids, strict=True)]
    winners = [a for a in answers if result_of(a) == "Succeeded"]
    losers = [a for a in answers if result_of(a) == "Failed"]
    assert (len(winners), len(losers)) == (12, 8)
    per_node: dict[str, int] = {}
    for w in winners:
        per_node[w["status"]["nodeName"]] = per_node.get(w["status"]["nodeName"], 0) + 1
    assert per_node == sizes
    for loser in losers:
        assert "phase" not in loser["status"]
        assert "no node has 1 free unit" in loser["status"]["bindRequest"]["message"]


def test_a_deleted_node_turns_its_devices_lost(
    operator: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """§5.6: devices Bound to a node that is deleted become Lost, keeping the node's name."""
    name = gpu_node({gpu.resource: 2}, name=f"doomed-{gpu.cls}")["metadata"]["name"]
    kube.create(kinds.GPU_DEVICE, gpu_device_body("held", namespace, gpu.cls, 2))
    wait_for("held bound", lambda: bound_on(kube, namespace, "held"))
    kube.delete(kinds.NODE, name)
    lost = wait_for("held lost", lambda: (s := status(kube, namespace, "held")).get("phase") == "Lost" and s)
    assert lost["nodeName"] == name
    assert name in lost["message"]


def test_a_device_bound_to_a_node_that_is_not_there_turns_lost(
    operator: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu
) -> None:
    """§5.6 from the view, not from one event: whatever made a device Bound to a missing node, it turns Lost.

    A Lost write that loses a conflict must be tried again; so must a node the operator never saw."""
    kube.create(kinds.GPU_DEVICE, gpu_device_body("held", namespace, gpu.cls))
    wait_for("waiting (no node serves the class)", lambda: status(kube, namespace, "held").get("phase") == "Pending")
    body = kube.get(kinds.GPU_DEVICE, "held", namespace)
    body["status"] = {"phase": "Bound", "nodeName": f"nowhere-{gpu.cls}"}
    kube.replace_status(kinds.GPU_DEVICE, body)
    lost = wait_for("held lost", lambda: (s := status(kube, namespace, "held")).get("phase") == "Lost" and s)
    assert lost["nodeName"] == f"nowhere-{gpu.cls}"


def test_an_unattached_lost_device_is_placed_again(
    operator: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """§2: self-healing: a Lost device that no VMI uses is bound again once a node has room."""
    first = gpu_node({gpu.resource: 1}, name=f"first-{gpu.cls}")["metadata"]["name"]
    kube.create(kinds.GPU_DEVICE, gpu_device_body("held", namespace, gpu.cls))
    wait_for("held bound", lambda: bound_on(kube, namespace, "held"))
    kube.delete(kinds.NODE, first)
    wait_for("held lost", lambda: status(kube, namespace, "held").get("phase") == "Lost")
    second = gpu_node({gpu.resource: 1}, name=f"second-{gpu.cls}")["metadata"]["name"]
    assert wait_for("held bound again", lambda: bound_on(kube, namespace, "held")) == second


def test_a_pending_device_is_bound_when_a_node_with_room_appears(
    operator: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """§5.5: Pending with a condition saying why; bound as soon as capacity appears, no timer needed."""
    gpu_node({gpu.resource: 1}, name=f"small-{gpu.cls}")
    kube.create(kinds.GPU_DEVICE, gpu_device_body("big", namespace, gpu.cls, 3))
    pending = wait_for("big pending", lambda: (s := status(kube, namespace, "big")).get("phase") == "Pending" and s)
    assert f"no node has 3 free units of {gpu.resource}" in pending["message"]
    placed = [c for c in pending["conditions"] if c["type"] == "Placed"]
    assert placed[0]["status"] == "False"
    roomy = gpu_node({gpu.resource: 4}, name=f"roomy-{gpu.cls}")["metadata"]["name"]
    assert wait_for("big bound", lambda: bound_on(kube, namespace, "big")) == roomy


def test_pending_devices_are_served_first_come_first_served(
    operator: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """§5.5: when room for one appears, the older Pending device gets it."""
    kube.create(kinds.GPU_DEVICE, gpu_device_body("older", namespace, gpu.cls))
    wait_for("older pending", lambda: status(kube, namespace, "older").get("phase") == "Pending")
    kube.create(kinds.GPU_DEVICE, gpu_device_body("newer", namespace, gpu.cls))
    wait_for("newer pending", lambda: status(kube, namespace, "newer").get("phase") == "Pending")
    gpu_node({gpu.resource: 1}, name=f"one-{gpu.cls}")
    wait_for("older bound", lambda: bound_on(kube, namespace, "older"))
    assert status(kube, namespace, "newer").get("phase") == "Pending"


def test_gpunode_status_follows_devices_and_capacity(
    operator: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """§1.3: held/allocatable/free per resource, classes served, LostCapacity when units vanish."""
    name = gpu_node({gpu.resource: 4}, name=f"acct-{gpu.cls}")["metadata"]["name"]
    kube.create(kinds.GPU_DEVICE, gpu_device_body("held", namespace, gpu.cls, 3))
    wait_for("held bound", lambda: bound_on(kube, namespace, "held"))

    def resources() -> list[dict[str, Any]] | None:
        body = kube.get_or_none(kinds.GPU_NODE, name)
        res = (body or {}).get("status", {}).get("resources")
        return res if res and res[0]["held"] == 3 else None

    assert wait_for("GPUNode held 3", resources) == [
        {"name": gpu.resource, "allocatable": 4, "held": 3, "unmanaged": 0, "free": 1}
    ]
    assert gpu.cls in kube.get(kinds.GPU_NODE, name)["status"]["classes"]
    nodes.set_gpus(kube, name, {gpu.resource: 2})

    def lost_capacity() -> dict[str, Any] | None:
        conditions = kube.get(kinds.GPU_NODE, name)["status"]["conditions"]
        c = next(c for c in conditions if c["type"] == "LostCapacity")
        return c if c["status"] == "True" else None

    assert "3 held, 2 allocatable" in wait_for("LostCapacity", lost_capacity)["message"]
    assert bound_on(kube, namespace, "held") == name  # kept Bound: §5.6


def test_answers_come_from_the_view_without_listing(
    operator: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """No LIST reaches the API server while requests are answered; each decision logs bind.answered.

    The view's periodic resync lists (§6.4): the start-up list is one, the first periodic one comes
    5 s in, and this module's operator has the next ten minutes later."""
    wait_for("the first periodic resync", lambda: len(operator.events("view.resynced")) >= 2, timeout=20)
    gpu_node({gpu.resource: 4}, name=f"nolist-{gpu.cls}")
    names = [f"vm{i}-gpu-0" for i in range(4)]
    for n in names:
        template_device(kube, namespace, n, gpu.cls)
    before = _list_count(kube)
    ids = [write_request(kube, namespace, [n], n.removesuffix("-gpu-0")) for n in names]
    for n, rid in zip(names, ids, strict=True):
        answer_of(kube, namespace, [n], rid)
    assert _list_count(kube) == before
    logged(operator, "bind.answered", lambda e: e["request_id"] == ids[-1])
    answered = {e["request_id"]: e for e in operator.events("bind.answered")}
    for rid in ids:
        entry = answered[rid]
        assert entry["result"] == "Succeeded"
        assert entry["node"] == f"nolist-{gpu.cls}"
        assert entry["namespace"] == namespace
        assert isinstance(entry["duration_ms"], float)


def _list_count(kube: Kube) -> int:
    """LIST requests the API server has served for the kinds the binder decides from."""
    watched = {"gpudevices", "gpuclasses", "gpubudgets", "gpunodes", "nodes", "namespaces"}
    total = 0
    for line in kube.raw_get("/metrics").text.splitlines():
        if line.startswith("apiserver_request_total{") and 'verb="LIST"' in line:
            labels = line[line.index("{") + 1 : line.index("}")]
            resource = next((p.split("=")[1].strip('"') for p in labels.split(",") if p.startswith("resource=")), "")
            if resource in watched:
                total += int(float(line.rsplit(" ", 1)[1]))
    return total


def test_concurrent_orders_never_exceed_a_budget(
    operator: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """§5.4/§7.4: ten requests for new devices against a budget of five: exactly five are placed."""
    gpu_node({gpu.resource: 20}, name=f"wide-{gpu.cls}")
    kube.create(
        kinds.GPU_BUDGET,
        {
            "apiVersion": "gpu.cozystack.io/v1alpha1",
            "kind": "GPUBudget",
            "metadata": {"name": "cap", "namespace": namespace},
            "spec": {"limits": {gpu.cls: 5}},
        },
    )
    budget_seen(kube, namespace, "cap")  # by the operator's view, not only the API server
    names = [f"vm{i}-gpu-0" for i in range(10)]
    for name in names:
        template_device(kube, namespace, name, gpu.cls)
    with concurrent.futures.ThreadPoolExecutor(max_workers=10) as pool:
        ids = list(pool.map(lambda n: write_request(kube, namespace, [n], n.removesuffix("-gpu-0")), names))
    answers = [answer_of(kube, namespace, [n], rid)[0] for n, rid in zip(names, ids, strict=True)]
    results = sorted(result_of(a) for a in answers)
    assert results == ["Failed"] * 5 + ["Succeeded"] * 5
    refused = [a for a in answers if result_of(a) == "Failed"]
    assert all(f"GPUBudget {namespace}/cap allows 5 units" in a["status"]["bindRequest"]["message"] for a in refused)
