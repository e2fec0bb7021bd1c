"""The VMI webhook of §3 called by the real API server over TLS, with the binder answering (§4).

Every refusal test asserts the denial names the object and rule, and that nothing
was left behind: no attachment, no bind request, no template device.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cozygpu.api import kinds, references
from cozygpu.api.names import ANNOTATION_DEVICES, API_VERSION
from cozygpu.devcluster import nodes
from cozygpu.kube.adapter import ApiError, Kube
from tests.support.bodies import gpu_class_body, gpu_device_body, unique, vmi_body
from tests.support.harness import OperatorProcess, wait_for
from tests.support.nodes import Gpu, GPUNodeFactory
from tests.support.objects import held
from tests.support.refusals import leftovers, refused

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("nothing_stale")]


@pytest.fixture
def room(gpu: Gpu, gpu_node: GPUNodeFactory) -> str:
    """One node with four units of the test's resource."""
    return str(gpu_node({gpu.resource: 4}, name=f"room-{gpu.cls}")["metadata"]["name"])


# -- success --------------------------------------------------------------------------


def test_held_and_template_devices_are_gathered_and_the_vmi_pinned(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """Two held devices on two nodes and a template entry land on one node; gpus entries and the pin are on the VMI."""
    a = gpu_node({gpu.resource: 1}, name=f"a-{gpu.cls}")["metadata"]["name"]
    gpu_node({gpu.resource: 1}, name=f"b-{gpu.cls}")
    held(kube, namespace, "h1", gpu.cls)
    held(kube, namespace, "h2", gpu.cls)
    nodes.set_gpus(kube, a, {gpu.resource: 3})
    wait_for("capacity seen", lambda: _gpunode_allocatable(kube, a) == 3)
    refs = [{"device": "h1"}, {"device": "h2"}, {"deviceTemplate": {"className": gpu.cls, "count": 1}}]
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["x"]}]}]
            }
        }
    }
    stored = kube.create(kinds.VMI, vmi_body("vm", namespace, refs, affinity=affinity))
    assert stored["spec"]["domain"]["devices"]["gpus"] == [
        {"name": "gpudev0-0", "deviceName": gpu.resource},
        {"name": "gpudev1-0", "deviceName": gpu.resource},
        {"name": "gpudev2-0", "deviceName": gpu.resource},
    ]
    [term] = stored["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": [a]}]
    assert term["matchExpressions"] == [{"key": "zone", "operator": "NotIn", "values": ["x"]}]
    for name in ("h1", "h2", "vm-gpu-2"):
        status = kube.get(kinds.GPU_DEVICE, name, namespace)["status"]
        assert (status["phase"], status["nodeName"], status["attachedTo"]["vmi"]) == ("Bound", a, "vm")
        assert status["bindRequest"]["result"] == "Succeeded"
    template = kube.get(kinds.GPU_DEVICE, "vm-gpu-2", namespace)
    assert template["metadata"]["labels"]["gpu.cozystack.io/template-device"] == "true"
    assert admitting.events("vmi.admitted")


def _gpunode_allocatable(kube: Kube, node: str) -> int:
    body = kube.get_or_none(kinds.GPU_NODE, node) or {}
    resources = body.get("status", {}).get("resources") or [{}]
    return int(resources[0].get("allocatable", 0))


def test_dry_run_checks_everything_and_writes_nothing(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, room: str
) -> None:
    """§3.10: the patch comes back as it would be; no template device, no attachment, no request."""
    held(kube, namespace, "h1", gpu.cls)
    refs = [{"device": "h1"}, {"deviceTemplate": {"className": gpu.cls, "count": 2}}]
    answer = kube.create(kinds.VMI, vmi_body("dry", namespace, refs), dry_run=True)
    assert [g["name"] for g in answer["spec"]["domain"]["devices"]["gpus"]] == ["gpudev0-0", "gpudev1-0", "gpudev1-1"]
    assert leftovers(kube, namespace, "dry") == []
    assert kube.get_or_none(kinds.VMI, "dry", namespace) is None
    bad = vmi_body("dry2", namespace, [{"device": "missing"}])
    with pytest.raises(ApiError, match="GPUDevice missing does not exist"):
        kube.create(kinds.VMI, bad, dry_run=True)


def test_a_vmi_without_the_label_is_never_sent_to_the_webhook(
    admitting: OperatorProcess, kube: Kube, namespace: str
) -> None:
    """§10: the objectSelector keeps VMIs without device references away, whatever their annotation says."""
    body = vmi_body("plain", namespace, "garbage")
    del body["metadata"]["labels"]["gpu.cozystack.io/device-reference"]
    assert kube.create(kinds.VMI, body)["metadata"]["name"] == "plain"


# -- §3.1, §3.2 --------------------------------------------------------------------------


def test_a_vmi_without_a_name_is_refused(admitting: OperatorProcess, kube: Kube, namespace: str) -> None:
    """§3.1: generateName cannot be used with device references (template names must be predictable)."""
    body = vmi_body("x", namespace, [{"device": "d"}])
    del body["metadata"]["name"]
    body["metadata"]["generateName"] = "vm-"
    with pytest.raises(ApiError) as raised:
        kube.create(kinds.VMI, body)
    assert "generateName is not supported" in raised.value.message


@pytest.mark.parametrize(
    ("annotation", "fragment"),
    [
        (None, "is missing"),
        ("{", "is not valid JSON"),
        ("[]", "lists no devices"),
        ('[{"device": "a", "deviceTemplate": {"className": "c", "count": 1}}]', "must be exactly one of"),
        ('[{"device": "Not_A_Name"}]', "is not a valid object name"),
        ('[{"deviceTemplate": {"className": "c", "count": 0}}]', "count must be a whole number of at least 1"),
    ],
)
def test_a_malformed_annotation_is_refused_naming_it(
    admitting: OperatorProcess, kube: Kube, namespace: str, annotation: str | None, fragment: str
) -> None:
    """§3.2: the message names the annotation and what is wrong."""
    message = refused(kube, vmi_body("vm", namespace, annotation))
    assert ANNOTATION_DEVICES in message
    assert fragment in message
    assert leftovers(kube, namespace, "vm") == []


annotation_texts = st.one_of(
    st.recursive(
        st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=8),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(
                st.sampled_from(["device", "deviceTemplate", "className", "count", "x"]), inner, max_size=3
            )
        ),
        max_leaves=8,
    ).map(json.dumps),
    st.text(max_size=30),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=annotation_texts)
@example(text='[{"device": "a"}]')  # valid references, of objects that do not exist: rarely drawn
@example(text='[{"deviceTemplate": {"className": "c", "count": 2}}, {"device": "a"}]')
def test_fuzzed_annotations_are_denials_never_errors(
    admitting: OperatorProcess, kube: Kube, namespace: str, text: str
) -> None:
    """Hypothesis through the API server: our webhook's 403 names what is wrong, the annotation's fault or each
    object its references name that does not exist."""
    name = unique("fz")
    message = refused(kube, vmi_body(name, namespace, text))
    for fault in _faults(text):
        assert fault in message
    assert leftovers(kube, namespace, name) == []


def _faults(text: str) -> list[str]:
    """What a refusal of `text` in an empty namespace must say: the annotation and the entry and field at fault,
    as §3.2's parser words it (tests/unit/api/test_references.py holds it to the spec); for valid references, each
    GPUDevice (§3.3) or deviceTemplate's GPUClass (§3.4) that does not exist."""
    try:
        refs = references.parse({ANNOTATION_DEVICES: text})
    except references.ReferenceError as e:
        return [ANNOTATION_DEVICES, str(e)]
    return [
        f"GPUDevice {r.name} does not exist"
        if isinstance(r, references.HeldRef)
        else f"deviceTemplate {i}: GPUClass {r.class_name} does not exist"
        for i, r in enumerate(refs)
    ]


# -- §3.3 held references ----------------------------------------------------------------


def test_held_reference_refusals_are_reported_together(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, room: str, gpu_node: GPUNodeFactory
) -> None:
    """§3.3: every reference is checked and all problems come back joined by '; '."""
    small = f"{gpu.cls}-small"
    kube.create(kinds.GPU_CLASS, gpu_class_body(small, f"example.com/{small}"))
    gpu_node({f"example.com/{small}": 1}, name=f"n-{small}")
    held(kube, namespace, "filler", small)
    kube.create(kinds.GPU_DEVICE, gpu_device_body("waiting", namespace, small))
    wait_for("pending", lambda: kube.get(kinds.GPU_DEVICE, "waiting", namespace).get("status", {}).get("phase"))
    held(kube, namespace, "taken", gpu.cls)
    kube.create(kinds.VMI, vmi_body("owner", namespace, [{"device": "taken"}]))
    message = refused(
        kube, vmi_body("vm", namespace, [{"device": "ghost"}, {"device": "waiting"}, {"device": "taken"}])
    )
    assert "GPUDevice ghost does not exist; GPUDevice waiting is Pending and holds no GPUs yet; " in message
    assert f"GPUDevice taken (node {room}) is attached to VMI owner" in message
    assert leftovers(kube, namespace, "vm") == []
    kube.delete(kinds.GPU_CLASS, small)


def test_a_held_device_being_deleted_is_refused(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, room: str
) -> None:
    """§3.3: a device with a deletion timestamp is not handed to a VM."""
    held(kube, namespace, "going", gpu.cls)
    kube.patch(kinds.GPU_DEVICE, "going", {"metadata": {"finalizers": ["test.cozy/hold"]}}, namespace)
    kube.delete(kinds.GPU_DEVICE, "going", namespace)
    message = refused(kube, vmi_body("vm", namespace, [{"device": "going"}]))
    assert "GPUDevice going" in message
    assert "is being deleted" in message
    assert leftovers(kube, namespace, "vm") == []
    kube.patch(kinds.GPU_DEVICE, "going", {"metadata": {"finalizers": None}}, namespace)


def test_a_node_that_stopped_serving_the_class_is_refused(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu_node: GPUNodeFactory
) -> None:
    """§3.3: the node's labels no longer match the class's nodeSelector."""
    tag = unique("sel")
    resource = f"example.com/{tag}"
    kube.create(kinds.GPU_CLASS, gpu_class_body(tag, resource, nodeSelector={"pool": tag}))
    name = gpu_node({resource: 2}, labels={"pool": tag}, name=f"n-{tag}")["metadata"]["name"]
    held(kube, namespace, "h", tag)
    node = kube.get(kinds.NODE, name)
    node["metadata"]["labels"]["pool"] = "elsewhere"
    kube.replace(kinds.NODE, node)
    time.sleep(0.5)  # the view hears of the relabel by watch
    message = refused(kube, vmi_body("vm", namespace, [{"device": "h"}]))
    assert f"GPUDevice h: node {name} no longer serves GPUClass {tag}" in message
    assert leftovers(kube, namespace, "vm") == []
    kube.delete(kinds.GPU_CLASS, tag)


def test_a_node_that_lost_capacity_is_refused(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, room: str
) -> None:
    """§3.3: LostCapacity with the node NotReady refuses the devices bound there."""
    held(kube, namespace, "h", gpu.cls)
    nodes.set_ready(kube, room, False)

    def lost() -> bool:
        body = kube.get_or_none(kinds.GPU_NODE, room) or {}
        conditions = body.get("status", {}).get("conditions", [])
        return any(c["type"] == "LostCapacity" and c["status"] == "True" for c in conditions)

    wait_for("LostCapacity", lost)
    message = refused(kube, vmi_body("vm", namespace, [{"device": "h"}]))
    assert f"GPUDevice h: node {room} has lost capacity" in message
    assert leftovers(kube, namespace, "vm") == []


# -- §3.4 template references -----------------------------------------------------------


def test_template_reference_refusals(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, room: str
) -> None:
    """§3.4: a same-named plain device, a missing class; reported together, nothing created."""
    kube.create(kinds.GPU_DEVICE, gpu_device_body("vm-gpu-0", namespace, gpu.cls))
    refs = [
        {"deviceTemplate": {"className": gpu.cls, "count": 1}},
        {"deviceTemplate": {"className": "no-such-class", "count": 1}},
    ]
    message = refused(kube, vmi_body("vm", namespace, refs))
    assert "GPUDevice vm-gpu-0 exists and was not made from a deviceTemplate" in message
    assert "deviceTemplate 1: GPUClass no-such-class does not exist" in message
    assert kube.get_or_none(kinds.GPU_DEVICE, "vm-gpu-1", namespace) is None


def test_existing_template_devices_that_are_not_this_vmis_are_refused(
    admitting: OperatorProcess, as_operator: Kube, kube: Kube, namespace: str, gpu: Gpu, room: str
) -> None:
    """§3.4: owned by an earlier VMI of the name, another class or count, attached to another VMI."""
    operator = as_operator
    owner = kube.create(kinds.VMI, vmi_body("old", namespace, [{"deviceTemplate": {"className": gpu.cls, "count": 1}}]))

    def template(name: str, count: int = 1, **meta: Any) -> None:
        body = gpu_device_body(name, namespace, gpu.cls, count)
        body["metadata"].update(labels={"gpu.cozystack.io/template-device": "true"}, **meta)
        operator.create(kinds.GPU_DEVICE, body)

    refs = {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "name": "vm",
        "uid": owner["metadata"]["uid"],
    }
    template("vm-gpu-0", ownerReferences=[refs])
    template("vm-gpu-1", 2)
    entries = [{"deviceTemplate": {"className": gpu.cls, "count": 1}}] * 2
    message = refused(kube, vmi_body("vm", namespace, entries))
    assert "GPUDevice vm-gpu-0 is still owned by an earlier VMI vm" in message
    assert f"GPUDevice vm-gpu-1 (GPUClass {gpu.cls}, count 2) does not match deviceTemplate 1" in message
    for name in ("vm-gpu-0", "vm-gpu-1"):
        operator.delete(kinds.GPU_DEVICE, name, namespace)
    # The template device of VMI old is attached to it; a VMI naming it by its template name is refused.
    message = refused(kube, vmi_body("x", namespace, [{"device": "old-gpu-0"}, {"device": "old-gpu-0"}]))
    assert "GPUDevice old-gpu-0" in message
    assert "is attached to VMI old" in message


def test_a_class_being_deleted_takes_no_template_orders(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu_node: GPUNodeFactory
) -> None:
    """§1.1/§3.4: a class with a deletion timestamp refuses new template devices."""
    tag = unique("del")
    kube.create(kinds.GPU_CLASS, gpu_class_body(tag, f"example.com/{tag}"))
    gpu_node({f"example.com/{tag}": 2}, name=f"n-{tag}")
    kube.patch(kinds.GPU_CLASS, tag, {"metadata": {"finalizers": ["test.cozy/hold"]}})
    kube.delete(kinds.GPU_CLASS, tag)
    time.sleep(0.5)  # the view hears of the deletion by watch
    message = refused(kube, vmi_body("vm", namespace, [{"deviceTemplate": {"className": tag, "count": 1}}]))
    assert f"deviceTemplate 0: GPUClass {tag} is being deleted and takes no new orders" in message
    assert leftovers(kube, namespace, "vm") == []
    kube.patch(kinds.GPU_CLASS, tag, {"metadata": {"finalizers": None}})


# -- §3.5 - §3.9 ------------------------------------------------------------------------


def test_one_device_referenced_twice_is_refused(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, room: str
) -> None:
    """§3.5: two references to one device are refused (after every reference checked out on its own)."""
    held(kube, namespace, "twice", gpu.cls)
    message = refused(kube, vmi_body("vm", namespace, [{"device": "twice"}, {"device": "twice"}]))
    assert message.endswith("GPUDevice twice is referenced twice")
    assert leftovers(kube, namespace, "vm") == []


def test_set_rules_are_enforced(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu_node: GPUNodeFactory
) -> None:
    """§3.6: mode label, maxCount per VM, and KubeVirt's permitted table when a KubeVirt CR exists."""
    tag = unique("set")
    resource = f"example.com/{tag}"
    kube.create(kinds.GPU_CLASS, gpu_class_body(tag, resource, maxCount=2))
    gpu_node({resource: 8}, name=f"n-{tag}")
    time.sleep(0.3)
    three = [{"deviceTemplate": {"className": tag, "count": 3}}]
    assert f"3 GPUs of GPUClass {tag} exceed its maxCount of 2 per VM" in refused(
        kube, vmi_body("vm", namespace, three)
    )
    one = [{"deviceTemplate": {"className": tag, "count": 1}}]
    message = refused(kube, vmi_body("vm", namespace, one, labels={"gpu.cozystack.io/mode": "vgpu"}))
    assert f"GPUClass {tag} has mode passthrough, and the VMI's pool takes mode vgpu" in message
    kubevirt = {
        "apiVersion": "kubevirt.io/v1",
        "kind": "KubeVirt",
        "metadata": {"name": "kv", "namespace": namespace},
        "spec": {
            "configuration": {
                "permittedHostDevices": {
                    "pciHostDevices": [{"pciVendorSelector": "10de:2236", "resourceName": "nvidia.com/OTHER"}]
                }
            }
        },
    }
    kube.create(kinds.KUBEVIRT, kubevirt)
    try:
        wait_for("permitted table seen", lambda: "permittedHostDevices" in _try(kube, one, namespace))
    finally:
        kube.delete(kinds.KUBEVIRT, "kv", namespace)
    assert leftovers(kube, namespace, "vm") == []


def _try(kube: Kube, refs: list[dict[str, Any]], namespace: str) -> str:
    try:
        kube.create(kinds.VMI, vmi_body(unique("kv"), namespace, refs), dry_run=True)
    except ApiError as e:
        return e.message
    return ""


def test_a_template_larger_than_any_node_is_refused(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, room: str
) -> None:
    """§3.7: the message says the most one node has."""
    message = refused(kube, vmi_body("vm", namespace, [{"deviceTemplate": {"className": gpu.cls, "count": 9}}]))
    assert f"deviceTemplate 0: no node has 9 units of {gpu.resource}; the most one has is 4" in message
    assert leftovers(kube, namespace, "vm") == []


@pytest.mark.parametrize("where", ["gpus", "hostDevices", "requests"])
def test_gpu_entries_of_the_vmis_own_are_refused(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, room: str, where: str
) -> None:
    """§3.8: GPUs asked for outside device references would bypass placement and budgets."""
    domain: dict[str, Any] = {"devices": {}, "resources": {"requests": {"memory": "1Gi"}}}
    if where == "gpus":
        domain["devices"]["gpus"] = [{"name": "mine", "deviceName": gpu.resource}]
    elif where == "hostDevices":
        domain["devices"]["hostDevices"] = [{"name": "hd", "deviceName": gpu.resource}]
    else:
        domain["resources"]["requests"][gpu.resource] = "1"
    refs = [{"deviceTemplate": {"className": gpu.cls, "count": 1}}]
    message = refused(kube, vmi_body("vm", namespace, refs, domain=domain))
    assert "the VMI carries GPU entries of its own next to device references" in message
    assert leftovers(kube, namespace, "vm") == []


def test_budgets_and_entitlement_refuse_template_orders(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu_node: GPUNodeFactory
) -> None:
    """§3.9: a full budget and a class the namespace is not entitled to are refused, naming them."""
    tag = unique("bud")
    resource = f"example.com/{tag}"
    kube.create(kinds.GPU_CLASS, gpu_class_body(tag, resource))
    kube.create(
        kinds.GPU_CLASS, gpu_class_body(f"{tag}-gold", resource, namespaceSelector={"matchLabels": {"tier": "gold"}})
    )
    gpu_node({resource: 8}, name=f"n-{tag}")
    kube.create(
        kinds.GPU_BUDGET,
        {
            "apiVersion": API_VERSION,
            "kind": "GPUBudget",
            "metadata": {"name": "cap", "namespace": namespace},
            "spec": {"limits": {tag: 1}},
        },
    )
    time.sleep(0.5)
    message = refused(kube, vmi_body("vm", namespace, [{"deviceTemplate": {"className": tag, "count": 2}}]))
    assert f"GPUBudget {namespace}/cap allows 1 units of GPUClass {tag}" in message
    message = refused(kube, vmi_body("vm", namespace, [{"deviceTemplate": {"className": f"{tag}-gold", "count": 1}}]))
    assert f"namespace {namespace} is not entitled to GPUClass {tag}-gold" in message
    assert leftovers(kube, namespace, "vm") == []


# -- races -----------------------------------------------------------------------------


def test_two_vmis_racing_for_one_held_device_exactly_one_wins(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, room: str
) -> None:
    """Optimistic concurrency on the attachment: one VMI gets the device, the other is refused cleanly."""
    held(kube, namespace, "shared", gpu.cls)

    def start(name: str) -> str:
        try:
            kube.create(kinds.VMI, vmi_body(name, namespace, [{"device": "shared"}]))
        except ApiError as e:
            return f"refused: {e.message}"
        return "admitted"

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = dict(zip(["vm-a", "vm-b"], pool.map(start, ["vm-a", "vm-b"]), strict=True))
    assert sorted(r.split(":")[0] for r in results.values()) == ["admitted", "refused"]
    winner = next(n for n, r in results.items() if r == "admitted")
    loser = next(n for n, r in results.items() if r != "admitted")
    assert kube.get(kinds.GPU_DEVICE, "shared", namespace)["status"]["attachedTo"]["vmi"] == winner
    assert "GPUDevice shared" in results[loser]
    assert leftovers(kube, namespace, loser) == []


def test_ten_vmis_racing_for_a_budget_of_five_exactly_five_win(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """§7.4: whatever the interleaving, admitted orders never exceed the budget."""
    gpu_node({gpu.resource: 20}, name=f"wide-{gpu.cls}")
    kube.create(
        kinds.GPU_BUDGET,
        {
            "apiVersion": API_VERSION,
            "kind": "GPUBudget",
            "metadata": {"name": "five", "namespace": namespace},
            "spec": {"limits": {gpu.cls: 5}},
        },
    )
    time.sleep(0.5)
    names = [f"vm{i}" for i in range(10)]

    def start(name: str) -> int:
        try:
            kube.create(kinds.VMI, vmi_body(name, namespace, [{"deviceTemplate": {"className": gpu.cls, "count": 1}}]))
        except ApiError as e:
            return e.status
        return 201

    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        codes = dict(zip(names, pool.map(start, names), strict=True))
    assert sorted(codes.values()) == [201] * 5 + [403] * 5
    admitted = [n for n, code in codes.items() if code == 201]
    for name in set(names) - set(admitted):
        assert leftovers(kube, namespace, name) == []
    bound = [d for d in kube.list(kinds.GPU_DEVICE, namespace) if d.get("status", {}).get("phase") == "Bound"]
    assert len(bound) == 5


def test_a_vmi_listing_more_devices_than_the_cap_is_refused_with_the_cap(
    admitting: OperatorProcess, kube: Kube, namespace: str
) -> None:
    """Issue 12: past the cap (64 by default) the VMI is refused before any device is read or written, and the
    message says the cap; nothing is left behind."""
    refs = [{"deviceTemplate": {"className": "a10", "count": 1}}] * 65
    message = refused(kube, vmi_body("many", namespace, refs))
    assert "lists 65 devices; a VMI may reference at most 64" in message
    assert leftovers(kube, namespace, "many") == []
