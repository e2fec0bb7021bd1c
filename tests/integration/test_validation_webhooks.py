"""GPUDevice, GPUClass and GPUBudget admission (§9) called by the real API server."""

from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path
from typing import Any

import pytest

from cozygpu.api import kinds
from cozygpu.api.names import API_VERSION
from cozygpu.kube import credentials
from cozygpu.kube.adapter import ApiError, Kube
from cozygpu.runtime.process.ledger import CONFIG_MAP, LEDGER
from tests.support.bodies import gpu_class_body, gpu_device_body, unique
from tests.support.harness import OperatorProcess, wait_for
from tests.support.nodes import Gpu, GPUNodeFactory
from tests.support.objects import update
from tests.support.seen import budget_seen

pytestmark = pytest.mark.integration


def denied(kube: Kube, body: dict[str, Any], hook: str = "gpudevice") -> str:
    with pytest.raises(ApiError) as raised:
        kube.create(kinds.kind(body["kind"]), body)
    assert raised.value.status == 403, raised.value.message
    assert f'admission webhook "{hook}.gpu.cozystack.io" denied the request' in raised.value.message
    return raised.value.message


def budget_body(name: str, namespace: str, limits: dict[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "GPUBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"limits": limits},
    }


def test_device_creates_that_could_never_be_served_are_refused(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu_node: GPUNodeFactory
) -> None:
    """§9.1: unknown class, above maxCount, above what any node has; nothing is created."""
    tag = unique("v")
    kube.create(kinds.GPU_CLASS, gpu_class_body(tag, f"example.com/{tag}", maxCount=2))
    gpu_node({f"example.com/{tag}": 3}, name=f"n-{tag}")
    wait_for("node seen", lambda: kube.get_or_none(kinds.GPU_NODE, f"n-{tag}"))
    assert "GPUClass nope does not exist" in denied(kube, gpu_device_body("a", namespace, "nope"))
    assert f"count 3 exceeds the maxCount of 2 of GPUClass {tag}" in denied(
        kube, gpu_device_body("b", namespace, tag, 3)
    )
    kube.create(kinds.GPU_CLASS, gpu_class_body(f"{tag}-wide", f"example.com/{tag}"))
    wait_for(
        "class seen",
        lambda: kube.get(kinds.GPU_NODE, f"n-{tag}").get("status", {}).get("classes") == [tag, f"{tag}-wide"],
    )
    message = denied(kube, gpu_device_body("c", namespace, f"{tag}-wide", 4))
    assert f"no node has 4 units of example.com/{tag}, so it could never be placed; the most one has is 3" in message
    assert kube.list(kinds.GPU_DEVICE, namespace) == []


def test_a_create_carrying_a_resource_version_is_refused_before_it_holds_a_budget(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """Issue 34 item 3: the API server refuses a create carrying metadata.resourceVersion only after the webhooks,
    so a webhook that admitted it held the order against the namespace's budgets for 30 s with nothing to show for
    it. The webhook refuses it first, naming the field, and the budget's room is whole at once."""
    gpu_node({gpu.resource: 8}, name=f"n-{gpu.cls}")
    kube.create(kinds.GPU_BUDGET, budget_body("one", namespace, {gpu.cls: 1}))
    budget_seen(kube, namespace, "one")
    phantom = gpu_device_body("phantom", namespace, gpu.cls)
    phantom["metadata"]["resourceVersion"] = "12345"
    assert "GPUDevice phantom: metadata.resourceVersion must not be set on a create" in denied(kube, phantom)
    kube.create(kinds.GPU_DEVICE, gpu_device_body("real", namespace, gpu.cls))  # before: refused, over the budget
    assert [d["metadata"]["name"] for d in kube.list(kinds.GPU_DEVICE, namespace)] == ["real"]


def test_concurrent_held_device_creates_cannot_together_pass_a_budget(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """§7.4: six creates of one unit against a budget of three, all at once: exactly three exist after."""
    gpu_node({gpu.resource: 8}, name=f"n-{gpu.cls}")
    kube.create(kinds.GPU_BUDGET, budget_body("three", namespace, {gpu.cls: 3}))
    budget_seen(kube, namespace, "three")  # by the operator's view, not only the API server

    def create(i: int) -> int:
        try:
            kube.create(kinds.GPU_DEVICE, gpu_device_body(f"d{i}", namespace, gpu.cls))
        except ApiError as e:
            return e.status
        return 201

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        codes = list(pool.map(create, range(6)))
    assert sorted(codes) == [201] * 3 + [403] * 3
    assert len(kube.list(kinds.GPU_DEVICE, namespace)) == 3


def test_an_admitted_order_is_charged_to_its_budget_by_uid_until_the_count_has_it(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """§7.4, §14: the API server's review of a create carries the new object's uid, and the order is on its
    budget's record under it before the create returns (a device made again under the name is another order);
    once the count has the device, the record lets it go and `used` shows it."""
    gpu_node({gpu.resource: 8}, name=f"n-{gpu.cls}")
    kube.create(kinds.GPU_BUDGET, budget_body("cap", namespace, {gpu.cls: 8}))
    budget_seen(kube, namespace, "cap")
    created = kube.create(kinds.GPU_DEVICE, gpu_device_body("x", namespace, gpu.cls, 2))
    status = kube.get(kinds.GPU_BUDGET, "cap", namespace)["status"]
    assert [(o["name"], o["uid"], o["count"]) for o in status["orders"]] == [("x", created["metadata"]["uid"], 2)]

    def counted() -> bool:
        status = kube.get(kinds.GPU_BUDGET, "cap", namespace)["status"]
        return status.get("usedTotal") == 2 and not status.get("orders") and status.get("orderedTotal") == 0

    wait_for("the order taken up by the count", counted, timeout=30)


def test_units_set_aside_with_an_order_are_stored_on_the_budget_and_let_go_unused(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """§7.4: the write that charges an order under a budget with room also sets units aside for the next orders,
    stored by the API server (other replicas count them from there); unused, they are written off after the
    window, and a create admitted within them meanwhile ends on the record or in `used`."""
    gpu_node({gpu.resource: 8}, name=f"n-{gpu.cls}")
    kube.create(kinds.GPU_BUDGET, budget_body("room", namespace, {gpu.cls: 400}))
    budget_seen(kube, namespace, "room")
    kube.create(kinds.GPU_DEVICE, gpu_device_body("x", namespace, gpu.cls))
    status = kube.get(kinds.GPU_BUDGET, "room", namespace)["status"]
    assert [(a["className"], a["units"]) for a in status["setAside"]] == [(gpu.cls, 32)], status
    assert status["setAsideTotal"] == 32 and status["setAside"][0]["holder"]
    kube.create(kinds.GPU_DEVICE, gpu_device_body("y", namespace, gpu.cls))

    def settled() -> bool:
        status = kube.get(kinds.GPU_BUDGET, "room", namespace)["status"]
        return not status.get("setAside") and status.get("usedTotal") == 2 and not status.get("orders")

    wait_for("the set-aside written off and both devices counted", settled, timeout=30)
    assert admitting.events("operator.synced"), "the operator's log is not read"
    assert admitting.events("budget.set_aside_dropped") == []  # stored as written: y was admitted within them


def test_an_older_replica_can_write_no_order_where_the_retired_ledger_was(
    admitting: OperatorProcess, kube: Kube, operator_kubeconfig: Path
) -> None:
    """Issue 36 item 3, a rolling upgrade: the operator leaves the retired ledger ConfigMap immutable, so an older
    replica's write of its orders there is refused by the API server (its create too: the name is taken), and its
    budgeted orders fail closed instead of being recorded where no newer replica looks."""
    ops = credentials.from_kubeconfig(operator_kubeconfig).namespace
    ledger = kube.get(CONFIG_MAP, LEDGER, ops)
    assert ledger.get("immutable") is True and not ledger.get("data")
    entry = {"namespace": "t1", "name": "x", "class": "a10", "count": 1, "expires": 4102444800.0}
    with pytest.raises(ApiError) as refused:
        kube.replace(CONFIG_MAP, {**ledger, "data": {"t1.x": json.dumps(entry)}})
    assert refused.value.status == 422, refused.value.message
    with pytest.raises(ApiError) as taken:
        kube.create(
            CONFIG_MAP, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": LEDGER, "namespace": ops}}
        )
    assert taken.value.status == 409, taken.value.message


def test_only_the_operator_creates_or_relabels_template_devices(
    admitting: OperatorProcess, as_operator: Kube, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """§1.2/§9.1: a tenant (here admin) cannot fake a template device, nor add or drop the label."""
    gpu_node({gpu.resource: 2}, name=f"n-{gpu.cls}")
    labelled = gpu_device_body("vm-gpu-0", namespace, gpu.cls)
    labelled["metadata"]["labels"] = {"gpu.cozystack.io/template-device": "true"}
    assert "only the GPU operator may create devices labelled" in denied(kube, labelled)
    as_operator.create(kinds.GPU_DEVICE, labelled)
    with pytest.raises(ApiError, match="only the GPU operator may add, change or remove the label"):
        update(kube, kinds.GPU_DEVICE, "vm-gpu-0", lambda b: b["metadata"].update(labels={}), namespace)
    kube.create(kinds.GPU_DEVICE, gpu_device_body("plain", namespace, gpu.cls))
    wait_for("plain placed", lambda: kube.get(kinds.GPU_DEVICE, "plain", namespace).get("status", {}).get("phase"))
    label = {"gpu.cozystack.io/template-device": "true"}
    with pytest.raises(ApiError, match="only the GPU operator may add, change or remove the label"):
        update(kube, kinds.GPU_DEVICE, "plain", lambda b: b["metadata"].update(labels=label), namespace)


def test_a_class_resource_name_is_fixed_while_devices_name_it(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """§9.2: resourceName changes only while no device names the class."""
    gpu_node({gpu.resource: 2}, name=f"n-{gpu.cls}")
    kube.create(kinds.GPU_DEVICE, gpu_device_body("d", namespace, gpu.cls))
    wait_for("device seen", lambda: kube.get(kinds.GPU_DEVICE, "d", namespace).get("status", {}).get("phase"))

    def move(body: dict[str, Any], to: str) -> None:
        body["spec"]["resourceName"] = to

    with pytest.raises(ApiError, match=f"GPUClass {gpu.cls}: spec.resourceName cannot change while 1 GPUDevices"):
        update(kube, kinds.GPU_CLASS, gpu.cls, lambda b: move(b, "example.com/elsewhere"))
    free = unique("free")
    kube.create(kinds.GPU_CLASS, gpu_class_body(free, "example.com/one"))
    updated = update(kube, kinds.GPU_CLASS, free, lambda b: move(b, "example.com/two"))
    assert updated["spec"]["resourceName"] == "example.com/two"
    kube.delete(kinds.GPU_CLASS, free)


def test_a_budget_naming_an_unknown_class_is_allowed_with_a_warning(
    admitting: OperatorProcess, kube: Kube, namespace: str
) -> None:
    """§9.3: the API server passes the webhook's warning on to the client."""
    response = kube.create_raw(kinds.GPU_BUDGET, budget_body("future", namespace, {"not-yet": 2}))
    assert response.status_code == 201
    assert "GPUClass not-yet does not exist (yet)" in response.headers.get("Warning", "")
