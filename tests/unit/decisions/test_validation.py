"""GPUDevice, GPUClass and GPUBudget admission (§9), without an API server."""

from __future__ import annotations

from cozygpu.api import GPUBudget, GPUClass, GPUDevice
from cozygpu.decisions import validation
from cozygpu.decisions.orders import Order
from tests.support.views import A10, budget, cluster, created, device, gpu_class, node

OPERATOR = "system:serviceaccount:cozy:gpu-operator"


def test_a_valid_held_device_is_admitted() -> None:
    """An existing class, a count that fits, room in the budget."""
    c = cluster(nodes=[node("n1", {A10: 4})], classes=[gpu_class("a10")])
    assert validation.device_create(c, GPUDevice.from_wire(created("d", count=2)), "alice", OPERATOR) is None


def test_device_create_refusals() -> None:
    """§9.1: missing or deleting class, above maxCount, above any node's allocatable, over budget."""
    deleting = gpu_class("gone-soon")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    c = cluster(
        nodes=[node("n1", {A10: 4})],
        classes=[gpu_class("a10"), gpu_class("small", maxCount=1), deleting],
        budgets=[budget("cap", limits={"a10": 3})],
    )

    def check(body: dict[str, object]) -> str | None:
        return validation.device_create(c, GPUDevice.from_wire(body), "alice", OPERATOR)

    assert check(created("d", "nope")) == "GPUDevice d: GPUClass nope does not exist"
    assert (
        check(created("d", "gone-soon")) == "GPUDevice d: GPUClass gone-soon is being deleted and takes no new orders"
    )
    assert check(created("d", "small", count=2)) == "GPUDevice d: count 2 exceeds the maxCount of 1 of GPUClass small"
    assert "no node has 5 units" in str(check(created("d", "a10", count=5)))
    assert "GPUBudget t1/cap allows 3 units" in str(check(created("d", "a10", count=4)))
    # Issue 34 item 3: the API server refuses a create that carries one, after the webhooks; refused first, it
    # reserves nothing against the budgets.
    assert check(device("d", "a10", 1)) == "GPUDevice d: metadata.resourceVersion must not be set on a create"


def test_only_the_operator_creates_template_devices() -> None:
    """§1.2/§9.1: the template label is the operator's; its own creates skip the budget (checked at §3.9)."""
    c = cluster(nodes=[node("n1", {A10: 4})], classes=[gpu_class("a10")], budgets=[budget("cap", limits={"a10": 0})])
    body = GPUDevice.from_wire(created("vm-gpu-0", template=True))
    assert "only the GPU operator may create" in str(validation.device_create(c, body, "alice", OPERATOR))
    assert validation.device_create(c, body, OPERATOR, OPERATOR) is None


def test_reservations_count_against_the_next_create() -> None:
    """§7.4: an admitted create not yet in the view uses room."""
    c = cluster(nodes=[node("n1", {A10: 4})], classes=[gpu_class("a10")], budgets=[budget("cap", limits={"a10": 1})])
    prior = [Order("t1", "a10", 1, "GPUDevice first")]
    assert validation.device_create(c, GPUDevice.from_wire(created("second")), "alice", OPERATOR, prior) is not None


def test_device_updates() -> None:
    """§9.1: spec is immutable; only the operator adds or removes the template label."""
    old = GPUDevice.from_wire(device("d"))
    resized = GPUDevice.from_wire(device("d", count=2))
    labelled = GPUDevice.from_wire(device("d", template=True))
    assert "spec is immutable" in str(validation.device_update(old, resized, "alice", OPERATOR))
    assert "only the GPU operator may add, change or remove" in str(
        validation.device_update(old, labelled, "alice", OPERATOR)
    )
    assert validation.device_update(old, labelled, OPERATOR, OPERATOR) is None


def test_class_resource_name_is_fixed_while_devices_name_it() -> None:
    """§9.2: resourceName cannot change while devices name the class; with none it can."""
    old = GPUClass.from_wire(gpu_class("a10"))
    new = GPUClass.from_wire(gpu_class("a10", "nvidia.com/OTHER"))
    used = cluster(classes=[gpu_class("a10")], devices=[device("d")])
    unused = cluster(classes=[gpu_class("a10")])
    assert validation.class_update(used, old, new) == (
        "GPUClass a10: spec.resourceName cannot change while 1 GPUDevices name the class"
    )
    assert validation.class_update(unused, old, new) is None


def test_budget_naming_an_unknown_class_is_a_warning() -> None:
    """§9.3: allowed, with a warning."""
    c = cluster(classes=[gpu_class("a10")])
    problem, warnings = validation.budget_warnings(c, GPUBudget.from_wire(budget("b", limits={"a10": 1, "future": 2})))
    assert problem is None
    assert warnings == ["GPUBudget b: GPUClass future does not exist (yet)"]
