"""GPUNode status (§1.3, §8): resources, classes, LostCapacity and ClassConflict."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cozygpu.api import ConditionStatus, GPUNodeStatus, NodeResource, UnmanagedPod, kinds
from cozygpu.api.gpunode import MAX_UNMANAGED_PODS
from cozygpu.decisions.nodestatus import gpunode_status
from cozygpu.runtime.view import View
from cozygpu.state.cluster import Cluster
from tests.support.views import A10, EPOCH, L40S, cluster, device, gpu_class, node, pod


def condition(status: GPUNodeStatus, type_: str) -> tuple[ConditionStatus, str]:
    c = next(c for c in status.conditions if c.type == type_)
    return c.status, c.message


def test_resources_classes_and_summary() -> None:
    """Per resource: allocatable from the Node, held by Bound devices, free; the classes served."""
    c = cluster(
        nodes=[node("n1", {A10: 4})],
        classes=[gpu_class("a10")],
        devices=[device("a", count=3, phase="Bound", node_name="n1")],
    )
    status = gpunode_status(c, "n1", [], EPOCH)
    assert status is not None
    assert status.resources == [NodeResource(name=A10, allocatable=4, held=3, free=1)]
    assert status.classes == ["a10"]
    assert status.summary == f"{A10} 3/4"
    assert condition(status, "LostCapacity")[0] is ConditionStatus.FALSE


def test_fewer_units_than_held_is_lost_capacity() -> None:
    """§1.3: a GPU fell off the bus: held exceeds what the node serves now."""
    c = cluster(
        nodes=[node("n1", {A10: 1})],
        classes=[gpu_class("a10")],
        devices=[device("a", count=2, phase="Bound", node_name="n1")],
    )
    status = gpunode_status(c, "n1", [], EPOCH)
    assert status is not None
    assert condition(status, "LostCapacity") == (ConditionStatus.TRUE, f"{A10}: 2 held, 1 allocatable")


def test_not_ready_with_devices_bound_is_lost_capacity() -> None:
    """§1.3: NotReady with devices bound; NotReady and empty is not."""
    bound = cluster(
        nodes=[node("n1", {A10: 2}, ready=False)],
        classes=[gpu_class("a10")],
        devices=[device("a", phase="Bound", node_name="n1")],
    )
    empty = cluster(nodes=[node("n1", {A10: 2}, ready=False)], classes=[gpu_class("a10")])
    s1, s2 = gpunode_status(bound, "n1", [], EPOCH), gpunode_status(empty, "n1", [], EPOCH)
    assert s1 is not None and s2 is not None
    assert condition(s1, "LostCapacity")[0] is ConditionStatus.TRUE
    assert condition(s2, "LostCapacity")[0] is ConditionStatus.FALSE


def test_a_gone_node_with_devices_is_lost_capacity() -> None:
    """§1.3: the node is gone but devices still name it."""
    c = cluster(classes=[gpu_class("a10")], devices=[device("a", phase="Bound", node_name="n1")])
    status = gpunode_status(c, "n1", [], EPOCH)
    assert status is not None
    assert condition(status, "LostCapacity")[0] is ConditionStatus.TRUE


def test_class_conflict_names_the_classes() -> None:
    """§8.2: ClassConflict is True with the clashing classes, which are not served."""
    c = cluster(nodes=[node("n1", {A10: 2, L40S: 2})], classes=[gpu_class("a10"), gpu_class("l40s", L40S, "vgpu")])
    status = gpunode_status(c, "n1", [], EPOCH)
    assert status is not None
    assert condition(status, "ClassConflict") == (
        ConditionStatus.TRUE,
        "classes that cannot be served together: a10, l40s",
    )
    assert status.classes == []


def test_a_node_that_serves_nothing_has_no_gpunode() -> None:
    """§1.3: GPUNodes exist only for nodes that serve a class (or that devices still name)."""
    c = cluster(nodes=[node("cpu-only", {})], classes=[gpu_class("a10")])
    assert gpunode_status(c, "cpu-only", [], EPOCH) is None


def test_transition_time_is_kept_while_a_condition_holds() -> None:
    """lastTransitionTime moves only when the status flips."""
    c = cluster(nodes=[node("n1", {A10: 2})], classes=[gpu_class("a10")])
    first = gpunode_status(c, "n1", [], EPOCH)
    assert first is not None
    later = gpunode_status(c, "n1", first.conditions, EPOCH.replace(year=2027))
    assert later is not None
    assert [x.last_transition_time for x in later.conditions] == [EPOCH] * len(first.conditions) == [EPOCH] * 3


# -- units held by pods the operator did not place (§1.3, §12) ----------------------------------


def set_of(vmi: str, count: int, node: str = "n1", phase: str = "Bound") -> dict[str, Any]:
    """A device attached to `vmi`, Bound (or not) on `node`."""
    return device(f"{vmi}-gpu-0", count=count, phase=phase, node_name=node, status={"attachedTo": {"vmi": vmi}})


def with_pods(c: Cluster, *bodies: dict[str, Any]) -> Cluster:
    for body in bodies:
        View(c).apply(kinds.POD, body)
    return c


def a10_node(allocatable: int = 4, devices: Sequence[dict[str, Any]] = ()) -> Cluster:
    return cluster(
        nodes=[node("n1", {A10: allocatable}), node("n2", {A10: 4})], classes=[gpu_class("a10")], devices=devices
    )


def only(status: GPUNodeStatus | None) -> NodeResource:
    assert status is not None and len(status.resources) == 1
    return status.resources[0]


def test_a_launcher_of_a_set_bound_here_is_not_unmanaged() -> None:
    """The operator placed it: its units are the set's held units, counted once, as held."""
    c = with_pods(a10_node(devices=[set_of("vm", 2)]), pod("virt-launcher-vm-x", {A10: 2}, vmi="vm"))
    status = gpunode_status(c, "n1", [], EPOCH)
    assert only(status) == NodeResource(name=A10, allocatable=4, held=2, unmanaged=0, free=2)
    assert status is not None and status.unmanaged_pods == [] and status.unmanaged_pod_count is None


def test_a_pod_that_is_no_launcher_is_unmanaged() -> None:
    """A plain pod asking for a managed resource (one from before the policy): its units and name are shown."""
    c = with_pods(a10_node(), pod("cuda-job", {A10: 1}))
    status = gpunode_status(c, "n1", [], EPOCH)
    assert only(status) == NodeResource(name=A10, allocatable=4, held=0, unmanaged=1, free=3)
    assert status is not None and status.unmanaged_pod_count == 1
    assert status.unmanaged_pods == [UnmanagedPod(pod="t1/cuda-job", units={A10: 1})]


def test_a_launcher_of_a_vmi_with_no_attached_devices_is_unmanaged() -> None:
    """A VMI the operator did not admit (no device references): its launcher's units are foreign."""
    c = with_pods(a10_node(), pod("virt-launcher-rogue-x", {A10: 1}, vmi="rogue"))
    status = gpunode_status(c, "n1", [], EPOCH)
    assert only(status).unmanaged == 1
    assert status is not None and status.unmanaged_pods == [
        UnmanagedPod(pod="t1/virt-launcher-rogue-x", vmi="rogue", units={A10: 1})
    ]


def test_a_launcher_on_another_node_than_its_set_is_unmanaged() -> None:
    """Its set holds units on n2; on n1 nothing the operator placed accounts for the pod."""
    c = with_pods(a10_node(devices=[set_of("vm", 1, node="n2")]), pod("virt-launcher-vm-x", {A10: 1}, vmi="vm"))
    assert only(gpunode_status(c, "n1", [], EPOCH)).unmanaged == 1
    assert only(gpunode_status(c, "n2", [], EPOCH)).unmanaged == 0


def test_a_launcher_whose_set_is_not_bound_is_unmanaged() -> None:
    """A Lost set holds nothing: the launcher running on its old node is not the operator's any more."""
    c = with_pods(a10_node(devices=[set_of("vm", 1, phase="Lost")]), pod("virt-launcher-vm-x", {A10: 1}, vmi="vm"))
    assert only(gpunode_status(c, "n1", [], EPOCH)).unmanaged == 1


def test_a_launcher_asking_more_than_its_set_holds_counts_the_excess() -> None:
    """§12.2 caps a launcher at its set: units beyond it are unmanaged, the rest are the set's."""
    c = with_pods(a10_node(devices=[set_of("vm", 1)]), pod("virt-launcher-vm-x", {A10: 3}, vmi="vm"))
    status = gpunode_status(c, "n1", [], EPOCH)
    assert only(status) == NodeResource(name=A10, allocatable=4, held=1, unmanaged=2, free=1)
    assert status is not None and status.unmanaged_pods[0].units == {A10: 2}


def test_resources_no_class_manages_are_not_the_operators() -> None:
    """An FPGA pod on a GPU node is nobody's business here."""
    c = with_pods(a10_node(), pod("fpga", {"example.com/fpga": 1}))
    status = gpunode_status(c, "n1", [], EPOCH)
    assert only(status).unmanaged == 0
    assert status is not None and status.unmanaged_pods == []


def test_unmanaged_and_held_above_allocatable_is_lost_capacity() -> None:
    """Devices are Bound to units a foreign pod uses: their VMs cannot start here, and the status names the pods."""
    c = with_pods(a10_node(allocatable=2, devices=[set_of("vm", 2)]), pod("old-job", {A10: 1}))
    status = gpunode_status(c, "n1", [], EPOCH)
    assert status is not None
    assert condition(status, "LostCapacity") == (
        ConditionStatus.TRUE,
        f"{A10}: 2 held by devices, 1 by pods the operator did not place (t1/old-job), 2 allocatable",
    )
    lost = next(x for x in status.conditions if x.type == "LostCapacity")
    assert lost.reason == "UnmanagedPods"


def test_unmanaged_pods_that_fit_beside_what_is_held_are_no_lost_capacity() -> None:
    """Foreign pods on units nobody holds are shown, but nothing the operator promised is lost."""
    c = with_pods(a10_node(allocatable=4, devices=[set_of("vm", 2)]), pod("old-job", {A10: 2}))
    status = gpunode_status(c, "n1", [], EPOCH)
    assert status is not None and only(status).unmanaged == 2
    assert condition(status, "LostCapacity")[0] is ConditionStatus.FALSE


def test_the_list_of_unmanaged_pods_is_capped_and_counted() -> None:
    """A node with many foreign pods names the first few by namespace and name and counts them all."""
    c = with_pods(a10_node(allocatable=64), *(pod(f"job-{i:02}", {A10: 1}) for i in range(MAX_UNMANAGED_PODS + 5)))
    status = gpunode_status(c, "n1", [], EPOCH)
    assert status is not None
    assert status.unmanaged_pod_count == MAX_UNMANAGED_PODS + 5
    assert [p.pod for p in status.unmanaged_pods] == [f"t1/job-{i:02}" for i in range(MAX_UNMANAGED_PODS)]
    assert only(status).unmanaged == MAX_UNMANAGED_PODS + 5


def test_lost_capacity_names_a_few_pods_and_counts_the_rest() -> None:
    """The condition's message stays short: three pods by name, then how many more."""
    c = with_pods(a10_node(allocatable=4, devices=[set_of("vm", 1)]), *(pod(f"job-{i}", {A10: 1}) for i in range(5)))
    status = gpunode_status(c, "n1", [], EPOCH)
    assert status is not None
    assert "(t1/job-0, t1/job-1, t1/job-2 and 2 more)" in condition(status, "LostCapacity")[1]


def test_a_drained_node_says_how_many_vms_left_it_once_none_is_left_to_move() -> None:
    """§6.8, issue 37 item 5: cordoned, with no VMI marked off it any more, the Evacuation condition is False with
    reason Evacuated and the count of VMs moved; a node not cordoned keeps no count, whatever it was given."""
    cordoned = cluster(nodes=[node("n1", {A10: 4}, unschedulable=True)], classes=[gpu_class("a10")])
    status = gpunode_status(cordoned, "n1", [], EPOCH, evacuated=3)
    assert status is not None and status.evacuated == 3
    evacuation = next(c for c in status.conditions if c.type == "Evacuation")
    assert (evacuation.status, evacuation.reason) == (ConditionStatus.FALSE, "Evacuated")
    assert evacuation.message == "3 VMs moved off the node"
    serving = cluster(nodes=[node("n1", {A10: 4})], classes=[gpu_class("a10")])
    plain = gpunode_status(serving, "n1", [], EPOCH, evacuated=3)
    assert plain is not None and plain.evacuated is None
    assert next(c for c in plain.conditions if c.type == "Evacuation").reason == "NoEvacuation"


def test_a_drained_node_that_moved_one_vm_says_so_in_the_singular() -> None:
    """The Evacuation message counts one VM as "1 VM", not "1 VMs"."""
    cordoned = cluster(nodes=[node("n1", {A10: 4}, unschedulable=True)], classes=[gpu_class("a10")])
    status = gpunode_status(cordoned, "n1", [], EPOCH, evacuated=1)
    assert status is not None
    assert condition(status, "Evacuation")[1] == "1 VM moved off the node"
