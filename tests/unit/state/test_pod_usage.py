"""The view's index of the units pods hold on nodes (§1.3, §12): what counts, what is dropped, what is stale."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cozygpu.api import kinds
from cozygpu.api import pods as api_pods
from cozygpu.api.names import ANNOTATION_DEVICES
from cozygpu.runtime.view import View
from cozygpu.state.pods import PodUsage, PodUse
from tests.support.views import A10, L40S, cluster, device, gpu_class, node, pod


class TestWhatIsKept:
    def test_a_running_pod_on_a_node_is_kept_with_its_extended_units_only(self) -> None:
        """CPU, memory, Kubernetes' own and KubeVirt's own resources are not units a GPU node serves."""
        usage = PodUsage()
        own = {"devices.kubevirt.io/kvm": "1", "hugepages-2Mi": "1Gi", "example.kubernetes.io/x": "1"}
        body = pod(asks={A10: "2", "example.com/fpga": "1", **own}, version=10)
        assert usage.upsert(body) == {"n1"}
        assert usage.on("n1") == [PodUse("t1", "p", "n1", {A10: 2, "example.com/fpga": 1}, None, 10)]

    @pytest.mark.parametrize(
        "body",
        [pod(node=None), pod(phase="Succeeded"), pod(phase="Failed"), pod(asks={}), pod(asks={"cpu": "4"})],
        ids=["not-scheduled", "succeeded", "failed", "asks-nothing", "asks-only-cpu"],
    )
    def test_pods_that_hold_no_units_are_not_kept(self, body: dict[str, Any]) -> None:
        """Off a node, ended, or asking for no extended resource: nothing held, nothing stored."""
        usage = PodUsage()
        assert usage.upsert(body) == set()
        assert len(usage) == 0 and usage.on("n1") == []

    def test_a_launcher_pod_names_its_vmi(self) -> None:
        """The VMI as controller: the index says whose launcher it is."""
        usage = PodUsage()
        usage.upsert(pod("virt-launcher-vm-x", vmi="vm"))
        usage.upsert(pod("lookalike", vmi=None))
        assert [(p.name, p.vmi) for p in usage.on("n1")] == [("lookalike", None), ("virt-launcher-vm-x", "vm")]

    @pytest.mark.parametrize("labels", [{"kubevirt.io": "x"}, {}], ids=["relabelled", "unlabelled"])
    def test_a_vmi_controller_makes_a_launcher_whatever_its_kubevirt_label_says(self, labels: dict[str, str]) -> None:
        """Issue 34 item 1: KubeVirt tells its launchers by the VMI controller reference; a tenant that relabels its
        launcher (`kubevirt.io=x`, or no label) leaves the guest running and the pod a launcher of its VMI. Before,
        it counted as a pod the operator did not place, and its guest as gone."""
        body = pod(vmi="vm", vmi_uid="u1")
        body["metadata"]["labels"] = labels
        usage = PodUsage()
        usage.upsert(body)
        assert usage.on("n1")[0].vmi == "vm" and usage.guest_running("t1", "u1")
        assert usage.on("n1")[0].watched == bool(labels)  # the launcher informer selects the label's key

    def test_whose_launcher_a_pod_is_stays_while_it_lives(self) -> None:
        """Issue 34 item 1: an owner reference removed or pointed elsewhere after the pod was seen as a launcher
        changes nothing the view says of it: its guest runs on until the pod ends."""
        usage = PodUsage()
        usage.upsert(pod(vmi="vm", vmi_uid="u1", version=1))
        unowned = pod(vmi=None, version=2)
        usage.upsert(unowned)
        assert (usage.on("n1")[0].vmi, usage.guest_running("t1", "u1")) == ("vm", True)
        usage.upsert(pod(vmi="other", vmi_uid="u9", version=3))
        assert (usage.on("n1")[0].vmi, usage.guest_running("t1", "u9")) == ("vm", False)
        usage.upsert(pod(vmi=None, phase="Succeeded", version=4))
        assert not usage.guest_running("t1", "u1")

    def test_a_pod_naming_another_namespaces_vmi_uid_is_no_guest_of_it(self) -> None:
        """Issue 34 item 6: an owner reference names an object of the pod's own namespace, so a pod elsewhere that
        names a victim VMI's uid keeps none of the victim's devices. Before, guests were kept by uid alone."""
        usage = PodUsage()
        usage.upsert(pod(vmi="vm", vmi_uid="victim-uid", namespace="mallory"))
        assert usage.guest_running("mallory", "victim-uid") and not usage.guest_running("t1", "victim-uid")

    def test_init_containers_count_at_their_largest_beside_the_sum_of_containers(self) -> None:
        """The scheduler's arithmetic, the same rule as the pod webhook's (api.pods.asked)."""
        usage = PodUsage()
        usage.upsert(pod("a", {A10: "1"}, init={A10: "3"}))
        usage.upsert(pod("b", {A10: "2"}, init={A10: "1"}))
        assert {p.name: dict(p.units) for p in usage.on("n1")} == {"a": {A10: 3}, "b": {A10: 2}}


class TestLaunchersByVMI:
    def test_launchers_of_a_name_are_found_whatever_their_uid_until_they_end(self) -> None:
        """§6.7: the launchers of every VMI object of a name that hold units, for the pod webhook's restart rule."""
        usage = PodUsage()
        usage.upsert(pod("old", vmi="vm", vmi_uid="u0", version=1))
        usage.upsert(pod("new", vmi="vm", vmi_uid="u1", version=2))
        usage.upsert(pod("other", vmi="vm2", version=3))
        assert [p.name for p in usage.launchers_of("t1", "vm")] == ["new", "old"]
        usage.upsert(pod("old", vmi="vm", vmi_uid="u0", phase="Succeeded", version=4))
        assert [p.name for p in usage.launchers_of("t1", "vm")] == ["new"]
        usage.remove("t1", "new")
        assert usage.launchers_of("t1", "vm") == []


class TestChanges:
    def test_a_pod_that_ends_is_dropped_and_its_node_reported(self) -> None:
        """Running -> Succeeded frees the units: the pod leaves the index and its node needs its status again."""
        usage = PodUsage()
        usage.upsert(pod(version=10))
        assert usage.upsert(pod(phase="Succeeded", version=11)) == {"n1"}
        assert usage.on("n1") == [] and len(usage) == 0

    def test_an_ended_pods_earlier_version_does_not_bring_it_back(self) -> None:
        """A late Running event (a resync's list) after Succeeded is stale."""
        usage = PodUsage()
        usage.upsert(pod(version=10))
        usage.upsert(pod(phase="Succeeded", version=12))
        assert usage.upsert(pod(version=11)) == set()
        assert len(usage) == 0

    def test_an_older_version_than_stored_is_ignored(self) -> None:
        """As in the rest of the view: a lower resourceVersion never overwrites a higher one."""
        usage = PodUsage()
        usage.upsert(pod(version=20))
        assert usage.upsert(pod(node=None, version=19)) == set()
        assert usage.upsert(pod(asks={L40S: "1"}, version=19)) == set()
        assert [(p.resource_version, dict(p.units)) for p in usage.on("n1")] == [(20, {A10: 1})]

    def test_a_new_version_that_changes_nothing_reports_no_node(self) -> None:
        """A status heartbeat of a pod changes no GPUNode: no node to recompute."""
        usage = PodUsage()
        usage.upsert(pod(version=10))
        assert usage.upsert(pod(version=11)) == set()
        assert usage.on("n1")[0].resource_version == 11

    def test_removal_reports_the_node_and_buries_the_pod(self) -> None:
        """A deleted pod leaves, and a late echo of it is not stored again."""
        usage = PodUsage()
        usage.upsert(pod(version=10))
        assert usage.remove("t1", "p", "12") == {"n1"}
        assert usage.upsert(pod(version=11)) == set()
        assert usage.remove("t1", "p") == set()
        assert usage.upsert(pod(version=13)) == {"n1"}  # a newer one is a new pod of the name

    def test_missing_names_pods_a_newer_list_lacks(self) -> None:
        """A resync's list lacking a pod stored at an older version: it was removed unseen."""
        usage = PodUsage()
        usage.upsert(pod("a", version=5))
        usage.upsert(pod("b", version=9))
        assert usage.missing(set(), "7") == [("t1", "a")]
        assert usage.missing({("t1", "a")}, "10") == [("t1", "b")]


class TestOddBodies:
    @pytest.mark.parametrize(
        "body",
        [
            None,
            "pod",
            {},
            {"metadata": "x"},
            {"metadata": {"name": "p", "resourceVersion": {"no": 1}}, "spec": {"nodeName": "n1", "containers": "c"}},
            {"metadata": {"name": "p"}, "spec": {"nodeName": ["n1"], "containers": [{"resources": {"limits": 1}}]}},
            {"metadata": {"name": "p"}, "spec": {"nodeName": "n1", "containers": [None, {"resources": []}]}},
            {"metadata": {"name": "p", "ownerReferences": [None, "x"]}, "spec": {"initContainers": [1]}},
        ],
    )
    def test_malformed_bodies_never_raise(self, body: Any) -> None:
        """What cannot be read asks for nothing; the index stays empty."""
        usage = PodUsage()
        assert usage.upsert(body) == set()
        assert len(usage) == 0

    def test_a_bad_quantity_counts_as_not_asked(self) -> None:
        """A quantity that is not a whole number is no units of that resource; the pod's others still count."""
        usage = PodUsage()
        usage.upsert(pod(asks={A10: "500m", L40S: "1"}))
        assert dict(usage.on("n1")[0].units) == {L40S: 1}
        with pytest.raises(api_pods.BadQuantity):
            api_pods.asked(pod(asks={A10: "500m"}), {A10})  # the webhook's reading refuses it instead


_pod_ops = st.lists(
    st.tuples(
        st.sampled_from(["pod", "launcher", "end", "bind", "unbind", "class", "vmi", "novmi", "record"]),
        st.integers(0, 3),  # which pod, VMI or device
        st.integers(0, 2),  # which node, or how many units
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(_pod_ops)
@example([("bind", 0, 1), ("launcher", 0, 1), ("vmi", 0, 0)])  # a VMI of the name with another uid appears
@example([("bind", 0, 1), ("launcher", 0, 1), ("record", 0, 0)])  # the set is another VMI object's
def test_unmanaged_units_always_match_a_recount(ops: list[tuple[str, int, int]]) -> None:
    """The view's unmanaged units per node (what placement subtracts) equal a recount from scratch, and the
    free-units order agrees with them, after any sequence of pod, device, VMI and class events. A launcher is
    measured against its VMI's set by uid (§6.7): an old launcher beside a new VMI of the name is not."""
    c = cluster(nodes=[node(f"n{k}", {A10: 4}) for k in range(3)], classes=[gpu_class("a10")])
    versions = iter(range(1000, 100_000))
    for op, i, j in ops:
        v = next(versions)
        if op == "pod":
            View(c).apply(kinds.POD, pod(f"p{i}", {A10: 1 + j}, node=f"n{j}", version=v))
        elif op == "launcher":  # of VMI object u0 or u1 of the name
            View(c).apply(
                kinds.POD,
                pod(
                    f"virt-launcher-vm{i}-{j % 2}",
                    {A10: 1 + j},
                    node=f"n{j}",
                    vmi=f"vm{i}",
                    vmi_uid=f"u{j % 2}",
                    version=v,
                ),
            )
        elif op == "vmi":  # VMI object u0 or u1 of the name, naming its template device or not
            names = '[{"deviceTemplate": {"className": "a10", "count": 1}}]' if j else '[{"device": "x"}]'
            View(c).apply(
                kinds.VMI,
                {
                    "metadata": {
                        "namespace": "t1",
                        "name": f"vm{i}",
                        "uid": f"u{j % 2}",
                        "resourceVersion": str(v),
                        "annotations": {ANNOTATION_DEVICES: names},
                    }
                },
            )
        elif op == "novmi":
            View(c).apply(
                kinds.VMI, {"metadata": {"namespace": "t1", "name": f"vm{i}", "resourceVersion": str(v)}}, deleted=True
            )
        elif op == "record":  # the collector records a uid on the device, or not yet
            d = c.devices.get(("t1", f"vm{i}-gpu-0"))
            if d is not None:
                body = d.wire()
                body["status"]["attachedTo"] = {"vmi": f"vm{i}", **({"uid": f"u{j % 2}"} if j < 2 else {})}
                body["metadata"]["resourceVersion"] = str(v)
                View(c).apply(kinds.GPU_DEVICE, body)
        elif op == "end":
            View(c).apply(kinds.POD, pod(f"p{i}", node=f"n{j}", phase="Succeeded", version=v))
        elif op == "bind":
            body = device(
                f"vm{i}-gpu-0",
                count=1 + j % 2,
                phase="Bound",
                node_name=f"n{j}",
                status={"attachedTo": {"vmi": f"vm{i}"}},
            )
            body["metadata"]["resourceVersion"] = str(v)
            View(c).apply(kinds.GPU_DEVICE, body)
        elif op == "unbind":
            gone = {"metadata": {"namespace": "t1", "name": f"vm{i}-gpu-0", "resourceVersion": str(v)}}
            View(c).apply(kinds.GPU_DEVICE, gone, deleted=True)
        else:
            cls = gpu_class("a10", A10 if j else L40S)
            cls["metadata"]["resourceVersion"] = str(v)
            View(c).apply(kinds.GPU_CLASS, cls)
    for k in range(3):
        name = f"n{k}"
        recount: dict[str, int] = {}
        for p in c.pods.on(name):
            own: dict[str, int] = {}
            live = c.vmis.get((p.namespace, p.vmi or ""))
            for d in c.devices.attached_to(p.namespace, p.vmi) if p.vmi else ():
                uid = d.status.attached_to.uid if d.status.attached_to else None
                names_it = c.vmis.names_device(p.namespace, p.vmi or "", d.name)
                if not (uid == p.vmi_uid or (uid is None and (live is None or (live == p.vmi_uid and names_it)))):
                    continue  # another VMI object's, or a device the pod's VMI does not name
                cls = c.classes.get(d.spec.class_name)
                if cls is not None and d.holds_gpus and d.status.node_name == name:
                    own[cls.spec.resource_name] = own.get(cls.spec.resource_name, 0) + d.spec.count
            for r, n in p.units.items():
                if n > own.get(r, 0):
                    recount[r] = recount.get(r, 0) + n - own.get(r, 0)
        assert c.capacity.unmanaged_units(name) == recount
        free = max(0, 4 - c.capacity.held_units(name).get(A10, 0) - recount.get(A10, 0))
        fits = set(c.capacity.best_fit(A10, 1))
        assert (name in fits) == (free >= 1)
