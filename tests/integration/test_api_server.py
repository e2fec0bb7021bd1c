"""The API of §1 is live in a real kube-apiserver: CRUD, status, and its own refusals."""

from __future__ import annotations

import pytest

from cozygpu.api import GPUBudget, GPUClass, GPUDevice, GPUNode, Phase, kinds
from cozygpu.api.names import API_VERSION
from cozygpu.kube.adapter import Invalid, Kube
from tests.support.bodies import A10, gpu_class_body, gpu_device_body, unique

pytestmark = pytest.mark.integration


def test_gpuclass_create_read_and_status_update(kube: Kube) -> None:
    """A class is stored as written and its status is written through /status."""
    name = unique("a10")
    kube.create(kinds.GPU_CLASS, gpu_class_body(name, maxCount=2, nodeSelector={"gpu": "a10"}))
    stored = GPUClass.from_wire(kube.get(kinds.GPU_CLASS, name))
    assert stored.spec.resource_name == A10
    assert stored.spec.max_count == 2
    assert stored.spec.node_selector == {"gpu": "a10"}
    stored.status.nodes = ["n1"]
    stored.status.allocatable, stored.status.held, stored.status.free = 4, 1, 3
    kube.replace_status(kinds.GPU_CLASS, stored.wire())
    again = GPUClass.from_wire(kube.get(kinds.GPU_CLASS, name))
    assert (again.status.nodes, again.status.free) == (["n1"], 3)
    kube.delete(kinds.GPU_CLASS, name)


def test_gpudevice_create_read_and_status_update(kube: Kube, namespace: str) -> None:
    """A device's status (phase, node, attachment, bind request) round-trips through /status."""
    kube.create(kinds.GPU_DEVICE, gpu_device_body("d1", namespace, "a10", 2))
    device = GPUDevice.from_wire(kube.get(kinds.GPU_DEVICE, "d1", namespace))
    assert (device.spec.class_name, device.spec.count, device.status.phase) == ("a10", 2, None)
    status = device.wire()
    status["status"] = {
        "phase": "Bound",
        "nodeName": "n1",
        "attachedTo": {"vmi": "vm1", "since": "2026-01-01T00:00:00Z"},
        "bindRequest": {
            "id": "req-1",
            "vmi": "vm1",
            "devices": ["d1"],
            "requestedAt": "2026-01-01T00:00:00Z",
            "result": "Succeeded",
        },
    }
    kube.replace_status(kinds.GPU_DEVICE, status)
    again = GPUDevice.from_wire(kube.get(kinds.GPU_DEVICE, "d1", namespace))
    assert again.status.phase is Phase.BOUND
    assert again.status.node_name == "n1"
    assert again.status.bind_request is not None
    assert again.status.bind_request.id == "req-1"


def test_status_written_on_the_main_resource_is_ignored(kube: Kube, namespace: str) -> None:
    """With the status subresource, a create or update cannot set status: only /status can."""
    body = gpu_device_body("d2", namespace, "a10")
    body["status"] = {"phase": "Bound", "nodeName": "n1"}
    created = kube.create(kinds.GPU_DEVICE, body)
    assert "phase" not in created.get("status", {})


def test_gpunode_and_gpubudget_create_read_and_status_update(kube: Kube, namespace: str) -> None:
    """GPUNode (cluster-scoped) and GPUBudget (namespaced) store spec and status."""
    node = unique("node")
    kube.create(kinds.GPU_NODE, {"apiVersion": API_VERSION, "kind": "GPUNode", "metadata": {"name": node}})
    stored = GPUNode.from_wire(kube.get(kinds.GPU_NODE, node))
    body = stored.wire()
    body["status"] = {
        "resources": [{"name": A10, "allocatable": 4, "held": 1, "free": 3}],
        "classes": ["a10"],
        "summary": f"{A10} 1/4",
        "conditions": [
            {
                "type": "LostCapacity",
                "status": "False",
                "reason": "Fine",
                "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
    }
    kube.replace_status(kinds.GPU_NODE, body)
    again = GPUNode.from_wire(kube.get(kinds.GPU_NODE, node))
    assert again.status.resources[0].free == 3
    assert again.status.conditions[0].type == "LostCapacity"
    kube.delete(kinds.GPU_NODE, node)

    budget = {
        "apiVersion": API_VERSION,
        "kind": "GPUBudget",
        "metadata": {"name": "b", "namespace": namespace},
        "spec": {"limits": {"a10": 4}, "total": 6, "namespaceSelector": {"matchLabels": {"tenant": "x"}}},
    }
    kube.create(kinds.GPU_BUDGET, budget)
    stored_budget = GPUBudget.from_wire(kube.get(kinds.GPU_BUDGET, "b", namespace))
    assert stored_budget.spec.limits == {"a10": 4}
    assert stored_budget.spec.namespace_selector is not None
    body = stored_budget.wire()
    body["status"] = {"used": {"a10": 2}, "usedTotal": 2}
    kube.replace_status(kinds.GPU_BUDGET, body)
    assert GPUBudget.from_wire(kube.get(kinds.GPU_BUDGET, "b", namespace)).status.used_total == 2


def test_a_budget_status_that_drops_its_records_is_refused(kube: Kube, namespace: str) -> None:
    """§7.4 in a rolling upgrade: an older operator writes a budget's status without `orders` and `setAside`,
    which would make every replica forget orders in flight and units set aside; the API server refuses it, and
    takes a status that empties them."""
    kube.create(
        kinds.GPU_BUDGET,
        {"apiVersion": API_VERSION, "kind": "GPUBudget", "metadata": {"name": "kept", "namespace": namespace}},
    )
    body = kube.get(kinds.GPU_BUDGET, "kept", namespace)
    expires = "2030-01-01T00:00:00Z"
    order = {"namespace": namespace, "name": "x", "uid": "u", "className": "a10", "count": 1, "expires": expires}
    aside = {"holder": "r/1", "className": "a10", "units": 4, "expires": expires}
    body["status"] = {"orders": [order], "setAside": [aside]}
    body = kube.replace_status(kinds.GPU_BUDGET, body)
    for dropped in ("orders", "setAside"):
        older = {**body, "status": {k: v for k, v in body["status"].items() if k != dropped}}
        with pytest.raises(Invalid) as refused:
            kube.replace_status(kinds.GPU_BUDGET, older)
        assert f"status.{dropped} may be emptied, not dropped" in refused.value.message
    body["status"] = {"used": {}, "usedTotal": 0, "orders": [], "setAside": []}
    emptied = GPUBudget.from_wire(kube.replace_status(kinds.GPU_BUDGET, body))
    assert emptied.status.orders == [] and emptied.status.set_aside == []


def test_api_server_refuses_a_device_with_count_zero(kube: Kube, namespace: str) -> None:
    """The CRD's minimum is live: count 0 is Invalid, naming the field."""
    with pytest.raises(Invalid, match=r"spec\.count"):
        kube.create(kinds.GPU_DEVICE, gpu_device_body("zero", namespace, "a10", 0))


def test_api_server_refuses_a_class_with_an_unknown_mode(kube: Kube) -> None:
    """The CRD's enum is live: mode mig is Invalid, naming the field."""
    with pytest.raises(Invalid, match=r"spec\.mode"):
        kube.create(kinds.GPU_CLASS, gpu_class_body(unique("mig"), mode="mig"))


def test_api_server_refuses_a_class_without_resource_name(kube: Kube) -> None:
    """resourceName is required."""
    body = gpu_class_body(unique("nores"))
    del body["spec"]["resourceName"]
    with pytest.raises(Invalid, match=r"spec\.resourceName"):
        kube.create(kinds.GPU_CLASS, body)


@pytest.mark.parametrize(("field", "value"), [("className", "l40s"), ("count", 3)])
def test_api_server_refuses_a_change_to_device_spec(kube: Kube, namespace: str, field: str, value: object) -> None:
    """The CEL immutability rules are live: className and count cannot change."""
    created = kube.create(kinds.GPU_DEVICE, gpu_device_body("fixed", namespace, "a10", 1))
    created["spec"][field] = value
    with pytest.raises(Invalid, match=f"spec.{field} is immutable"):
        kube.replace(kinds.GPU_DEVICE, created)
    stored = kube.get(kinds.GPU_DEVICE, "fixed", namespace)
    assert stored["spec"] == {"className": "a10", "count": 1}


def test_api_server_allows_metadata_changes_on_a_device(kube: Kube, namespace: str) -> None:
    """Immutability covers the spec only: labels and finalizers still change."""
    created = kube.create(kinds.GPU_DEVICE, gpu_device_body("meta", namespace, "a10", 1))
    created["metadata"]["labels"] = {"team": "ml"}
    updated = kube.replace(kinds.GPU_DEVICE, created)
    assert updated["metadata"]["labels"] == {"team": "ml"}


def test_short_names_clash_with_no_resource_the_server_serves(kube: Kube) -> None:
    """Our short names are not a name or short name of any other served resource."""
    ours = {s for k in (GPUClass, GPUDevice, GPUNode, GPUBudget) for s in k.crd.short_names}
    others: set[str] = set()
    groups = kube.raw_get("/apis").json()["groups"]
    versions = ["/api/v1"] + [f"/apis/{g['preferredVersion']['groupVersion']}" for g in groups]
    for path in versions:
        for r in kube.raw_get(path).json()["resources"]:
            if r.get("group", path).startswith("gpu.cozystack.io") or "gpu.cozystack.io" in path:
                continue
            others |= {r["name"], r.get("singularName", ""), *r.get("shortNames", [])}
    assert len(others) > 50, "discovery returned too little to judge"
    assert not ours & others
