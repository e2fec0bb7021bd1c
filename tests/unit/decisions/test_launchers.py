"""§12.2 for pods, as pure decisions: who may ask for managed GPUs, for which VMI, how many, where."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from cozygpu.api import GPUDevice, kinds, pods
from cozygpu.api.names import ANNOTATION_DEVICES, LABEL_DEVICE_REFERENCE, TRUE
from cozygpu.decisions import launchers
from cozygpu.decisions.pinning import is_pinned, pinned_spec
from cozygpu.runtime.view import View
from tests.support.views import A10, EPOCH, L40S, cluster, device, gpu_class

CONTROLLER = "system:serviceaccount:kubevirt:kubevirt-controller"


def launcher(
    asks: dict[str, str], *, vmi: str = "vm", uid: str = "u1", init: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    """A pod as virt-controller renders it: KubeVirt's devices, the GPUs, owned by the VMI."""
    resources = {"devices.kubevirt.io/kvm": "1", "cpu": "1", **asks}
    body: dict[str, Any] = {
        "metadata": {
            "generateName": f"virt-launcher-{vmi}-",
            "namespace": "t1",
            "labels": {"kubevirt.io": "virt-launcher"},
            "ownerReferences": [
                {
                    "apiVersion": "kubevirt.io/v1",
                    "kind": "VirtualMachineInstance",
                    "name": vmi,
                    "uid": uid,
                    "controller": True,
                }
            ],
        },
        "spec": {
            "containers": [{"name": "compute", "resources": {"requests": resources, "limits": resources}}],
            **spec,
        },
    }
    if init:
        body["spec"]["initContainers"] = [{"name": "init", "resources": {"limits": init}}]
    return body


def attached(
    name: str, cls: str, count: int, node: str | None, *, vmi: str = "vm", uid: str | None = "u1", phase: str = "Bound"
) -> GPUDevice:
    status: dict[str, Any] = {"attachedTo": {"vmi": vmi, "since": EPOCH.isoformat(), **({"uid": uid} if uid else {})}}
    return GPUDevice.from_wire(device(name, cls, count, phase=phase, node_name=node, status=status))


CLASSES = cluster(classes=[gpu_class("a10", A10), gpu_class("l40s", L40S, mode="vgpu")]).classes


def judge(
    pod: dict[str, Any], devices: list[GPUDevice], user: str = CONTROLLER, *, vmis: Sequence[dict[str, Any]] = ()
) -> launchers.Verdict:
    """As the pod webhook judges: with the set the view holds for the pod's VMI (`Cluster.vmis.set_of`)."""
    view = cluster(
        classes=[gpu_class("a10", A10), gpu_class("l40s", L40S, mode="vgpu")], devices=[d.wire() for d in devices]
    )
    for vmi in vmis:
        View(view).apply(kinds.VMI, vmi)
    owner = pods.owner_vmi(pod)
    the_set = view.vmis.set_of("t1", *owner) if owner else []
    return launchers.judge(pod, user, CONTROLLER, the_set, CLASSES)


class TestWhatAPodAsks:
    def test_containers_add_up_and_init_containers_count_at_their_largest(self) -> None:
        """The scheduler's own arithmetic: containers summed, an init container only if it asks more."""
        pod = launcher({A10: "1"}, init={A10: "3"})
        pod["spec"]["containers"].append({"name": "side", "resources": {"limits": {A10: "1"}}})
        assert pods.asked(pod, {A10}) == {A10: 3}
        assert pods.asked(launcher({A10: "2"}, init={A10: "1"}), {A10}) == {A10: 2}

    def test_only_managed_resources_count(self) -> None:
        """KubeVirt's devices and unmanaged extended resources are not the operator's."""
        assert pods.asked(launcher({"example.com/fpga": "1"}), {A10}) == {}

    @pytest.mark.parametrize(("quantity", "units"), [("2", 2), ("1k", 1000), ("1Ki", 1024)])
    def test_quantities_are_whole_units(self, quantity: str, units: int) -> None:
        """Extended resources are whole numbers, with Kubernetes' suffixes."""
        assert pods.units(quantity) == units

    def test_a_fractional_quantity_is_refused_naming_it(self) -> None:
        """A quantity that is not a whole number is refused, not guessed at."""
        verdict = judge(launcher({A10: "500m"}), [attached("g", "a10", 1, "n1")])
        assert verdict.refusal is not None and "'500m' is not a whole number" in verdict.refusal


class TestWhoMayAsk:
    def test_a_pod_without_managed_gpus_passes_untouched(self) -> None:
        """Nothing managed asked: no pin, no refusal."""
        assert judge(launcher({"example.com/fpga": "1"}), []) == launchers.Verdict()

    def test_only_kubevirts_controller_may_create_a_pod_with_managed_gpus(self) -> None:
        """A tenant creating a look-alike launcher pod is refused, the resource and the rightful creator named."""
        verdict = judge(launcher({A10: "1"}), [attached("g", "a10", 1, "n1")], user="alice")
        assert verdict.refusal is not None
        assert A10 in verdict.refusal and CONTROLLER in verdict.refusal

    def test_a_pod_not_controlled_by_a_vmi_is_refused(self) -> None:
        """The controller's pods for anything but a VMI do not get managed GPUs."""
        pod = launcher({A10: "1"})
        pod["metadata"]["ownerReferences"][0]["kind"] = "VirtualMachineInstanceMigration"
        verdict = judge(pod, [attached("g", "a10", 1, "n1")])
        assert verdict.refusal is not None and "not controlled by a VirtualMachineInstance" in verdict.refusal

    def test_a_vmi_the_operator_did_not_admit_gets_no_managed_gpus(self) -> None:
        """No device attached to the VMI: it was not admitted with GPUs (§12.2)."""
        verdict = judge(launcher({A10: "1"}), [])
        assert verdict.refusal is not None and "no GPUDevices attached" in verdict.refusal

    def test_devices_of_an_earlier_vmi_of_the_name_are_not_this_pods(self) -> None:
        """Attachments are told apart by uid (§6.2): another VMI object's set does not count."""
        verdict = judge(launcher({A10: "1"}, uid="new"), [attached("g", "a10", 1, "n1", uid="old")])
        assert verdict.refusal is not None and "no GPUDevices attached" in verdict.refusal

    def test_a_device_a_losing_create_of_the_name_attached_is_not_the_launchers(self) -> None:
        """§14.2: a device attached to the name, its uid not recorded yet, counts for the VMI that exists only
        if that VMI names it: another create of the name, refused AlreadyExists, attached it."""
        mine, theirs = attached("g0", "a10", 1, "n7", uid=None), attached("g1", "a10", 1, "n2", uid=None)
        meta = {
            "namespace": "t1",
            "name": "vm",
            "uid": "u1",
            "resourceVersion": "1",
            "labels": {LABEL_DEVICE_REFERENCE: TRUE},
            "annotations": {ANNOTATION_DEVICES: '[{"device": "g0"}]'},
        }
        vm = {"metadata": meta}
        assert judge(launcher({A10: "1"}), [mine, theirs], vmis=[vm]) == launchers.Verdict(node="n7")
        # Before the view has the VMI, both count (the pod may come first): the set is on two nodes.
        assert "more than one node" in (judge(launcher({A10: "1"}), [mine, theirs]).refusal or "")


class TestWhereItRuns:
    def test_a_launcher_is_pinned_to_its_sets_node(self) -> None:
        """The set held on one node: the pod runs there, whether or not the uid is recorded yet (§6.1)."""
        devices = [attached("g0", "a10", 1, "n7"), attached("g1", "a10", 1, "n7", uid=None)]
        assert judge(launcher({A10: "2"}), devices) == launchers.Verdict(node="n7")

    def test_asking_fewer_units_than_the_set_holds_is_fine(self) -> None:
        """The set is a ceiling, not an exact count."""
        assert judge(launcher({A10: "1"}), [attached("g", "a10", 2, "n1")]).node == "n1"

    def test_asking_more_units_than_the_set_holds_is_refused(self) -> None:
        """A pod asking 3 of a resource the set holds 2 of, or one the set holds none of, is refused."""
        verdict = judge(launcher({A10: "3", L40S: "1"}), [attached("g", "a10", 2, "n1")])
        assert verdict.refusal is not None
        assert f"3 of {A10} (its devices hold 2)" in verdict.refusal
        assert f"1 of {L40S} (its devices hold 0)" in verdict.refusal

    def test_a_set_that_holds_no_gpus_is_refused(self) -> None:
        """A Lost or Pending device of the set: there is no node to run on."""
        verdict = judge(launcher({A10: "1"}), [attached("g", "a10", 1, "n1", phase="Lost")])
        assert verdict.refusal is not None and "not held" in verdict.refusal and "g" in verdict.refusal

    def test_a_set_on_two_nodes_is_refused(self) -> None:
        """The binder places a set on one node; anything else is not runnable."""
        verdict = judge(launcher({A10: "2"}), [attached("g0", "a10", 1, "n1"), attached("g1", "a10", 1, "n2")])
        assert verdict.refusal is not None and "n1, n2" in verdict.refusal

    def test_a_pod_already_assigned_elsewhere_is_refused(self) -> None:
        """spec.nodeName skips the scheduler: it must name the set's node."""
        verdict = judge(launcher({A10: "1"}, nodeName="n2"), [attached("g", "a10", 1, "n1")])
        assert verdict.refusal is not None and "assigned to node n2" in verdict.refusal


class TestThePin:
    def test_every_required_term_names_the_node(self) -> None:
        """Existing terms keep their own requirements and gain the pin; none: one is made."""
        spec = {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                        ]
                    }
                }
            }
        }
        out = pinned_spec(spec, "n1")
        terms = out["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert [t["matchFields"] for t in terms] == [[{"key": "metadata.name", "operator": "In", "values": ["n1"]}]] * 2
        assert [t["matchExpressions"][0]["values"] for t in terms] == [["a"], ["b"]]
        assert is_pinned(out, "n1") and not is_pinned(spec, "n1") and not is_pinned({}, "n1")
        assert is_pinned(pinned_spec({}, "n1"), "n1")

    def test_pinning_twice_adds_nothing(self) -> None:
        """A reinvocation returns the same spec."""
        once = pinned_spec({}, "n1")
        assert pinned_spec(once, "n1") == once


class TestARestartOfTheName:
    def test_a_new_vmis_launcher_waits_while_an_old_launcher_of_the_name_holds_units(self) -> None:
        """§6.7: a new VMI of the name took the set over; its launcher is refused, naming the old pod, until the
        previous guest has let the units go."""
        devices = [attached("g", "a10", 1, "n1")]
        verdict = launchers.judge(
            launcher({A10: "1"}), CONTROLLER, CONTROLLER, devices, CLASSES, previous=["t1/virt-launcher-vm-old"]
        )
        assert verdict.refusal is not None and "previous guest of VMI vm still holds its GPUs" in verdict.refusal
        assert "t1/virt-launcher-vm-old" in verdict.refusal
        assert launchers.judge(launcher({A10: "1"}), CONTROLLER, CONTROLLER, devices, CLASSES).node == "n1"


class TestAnExemptNamespace:
    def test_a_pod_with_no_set_of_the_operators_passes_untouched(self) -> None:
        """§12.3: in a namespace exempt by its label, a launcher of a VMI the operator did not admit, or a pod
        anyone labelled as one, is not the operator's to refuse."""
        for user in (CONTROLLER, "alice"):
            verdict = launchers.judge(launcher({A10: "1"}), user, CONTROLLER, [], CLASSES, exempt=True)
            assert verdict == launchers.Verdict()
        assert judge(launcher({A10: "1"}), []).refusal is not None  # the same pod, not exempt

    def test_a_launcher_of_an_admitted_vmi_is_still_pinned_and_held_to_its_set(self) -> None:
        """The exemption frees what is unmanaged; a held set keeps its pin and its limits (§12.2)."""
        devices = [attached("a", "a10", 1, "n1")]
        verdict = launchers.judge(launcher({A10: "1"}), CONTROLLER, CONTROLLER, devices, CLASSES, exempt=True)
        assert verdict.node == "n1"
        over = launchers.judge(launcher({A10: "2"}), CONTROLLER, CONTROLLER, devices, CLASSES, exempt=True)
        assert over.refusal is not None and "more GPUs than VMI vm holds" in over.refusal
