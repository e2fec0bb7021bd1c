"""No bypass (§12.1, §12.3): the API server itself refuses managed GPUs taken behind the operator's back."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from cozygpu.api import kinds
from cozygpu.api.names import ANNOTATION_ADMITTED, LABEL_DEVICE_REFERENCE
from cozygpu.devcluster import identity
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import ApiError, Body, Forbidden, Kube
from cozygpu.runtime.admission import policy, webhooks
from tests.support import faults
from tests.support.bodies import gpu_class_body, gpu_device_body, vmi_body
from tests.support.harness import OperatorProcess, wait_for
from tests.support.nodes import Gpu, GPUNodeFactory, fresh_gpu
from tests.support.operators import start_admitting_operator, unregister_webhooks


def unlabelled_vmi(name: str, namespace: str, devices: dict[str, Any] | None = None, **domain: Any) -> Body:
    """A VMI without device references, with GPU entries of its own."""
    body = vmi_body(
        name,
        namespace,
        None,
        domain={"devices": devices or {}, "resources": domain.get("resources", {"requests": {"memory": "1Gi"}})},
    )
    del body["metadata"]["labels"]["gpu.cozystack.io/device-reference"]
    return body


def pod(name: str, namespace: str, resource: str, labels: dict[str, str] | None = None) -> Body:
    asks = {resource: "1"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {
            "containers": [
                {"name": "c", "image": "registry.invalid/x", "resources": {"requests": asks, "limits": asks}}
            ]
        },
    }


def refused(kube: Kube, kind: kinds.Kind, body: Body) -> str:
    """The policy's refusal, once the API server has the policy's parameters and the webhook configurations as last
    written (it reads both from watches)."""

    def attempt() -> str | None:
        try:
            created = kube.create(kind, body)
        except ApiError as e:
            if e.status == 500 and "failed calling webhook" in e.message:
                return None  # a webhook configuration just changed: the API server reads it from a watch
            if e.status not in (403, 422):
                raise
            return e.message
        kube.delete(kind, created["metadata"]["name"], created["metadata"]["namespace"])
        return None

    return wait_for(f"{body['kind']} {body['metadata']['name']} refused", attempt, timeout=15)


def test_a_vmi_without_device_references_naming_a_managed_resource_is_refused(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu
) -> None:
    """§12.1: in gpus, hostDevices or resources alike; the message names the resource and the way in."""
    shapes = [
        {"devices": {"gpus": [{"name": "g", "deviceName": gpu.resource}]}},
        {"devices": {"hostDevices": [{"name": "h", "deviceName": gpu.resource}]}},
        {"resources": {"requests": {"memory": "1Gi"}, "limits": {gpu.resource: "1"}}},
    ]
    for i, shape in enumerate(shapes):
        message = refused(kube, kinds.VMI, unlabelled_vmi(f"direct-{i}", namespace, **shape))
        assert f"VMI direct-{i} names {gpu.resource}, a GPU resource the GPU operator manages, directly" in message
        assert "gpu.cozystack.io/device-reference=true" in message and "gpu.cozystack.io/devices" in message
        assert kube.get_or_none(kinds.VMI, f"direct-{i}", namespace) is None


def test_an_unmanaged_resource_is_untouched(admitting: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu) -> None:
    """A resource no GPUClass names is not the operator's: VMIs and pods asking for it are created as written."""
    fpga = {"gpus": [{"name": "g", "deviceName": "example.com/fpga"}]}
    vmi = kube.create(kinds.VMI, unlabelled_vmi("other", namespace, fpga))
    assert vmi["spec"]["domain"]["devices"]["gpus"][0]["deviceName"] == "example.com/fpga"
    assert kube.create(kinds.POD, pod("fpga", namespace, "example.com/fpga"))["metadata"]["name"] == "fpga"


def test_a_pod_asking_for_a_managed_resource_is_refused_unless_kubevirt_renders_it(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu
) -> None:
    """§12.2, §12.3: a plain pod, or one labelled as a launcher by anyone but KubeVirt's controller, is refused."""
    message = refused(kube, kinds.POD, pod("sneaky", namespace, gpu.resource))
    assert f"Pod sneaky asks for {gpu.resource}, a GPU resource the GPU operator hands out" in message
    assert "only KubeVirt launcher pods" in message


def test_the_guard_holds_while_the_operator_is_down(
    operator_kubeconfig: Path, kube: Kube, namespace: str, gpu: Gpu, tmp_path: Path
) -> None:
    """§12.3: the operator killed outright (nothing unregistered), the API server still refuses on its own."""
    process = start_admitting_operator(operator_kubeconfig, tmp_path)
    try:
        assert kube.get(kinds.POLICY, policy.NAME)["spec"]["paramKind"]["kind"] == "ConfigMap"
        process.kill()
        message = refused(kube, kinds.POD, pod("while-down", namespace, gpu.resource))
        assert "only KubeVirt launcher pods" in message
        body = unlabelled_vmi("while-down", namespace, {"gpus": [{"name": "g", "deviceName": gpu.resource}]})
        assert "directly" in refused(kube, kinds.VMI, body)
    finally:
        process.kill()
        # The webhooks of a killed operator would refuse what they cannot serve; the policy stays, as `--dev` leaves
        # it: deleted and created again, the API server would stop seeing its parameter change (docs/admission.md),
        # and no class created after could be seen guarded.
        for kind, name in (
            (kinds.MUTATING_WEBHOOKS, webhooks.MUTATING_NAME),
            (kinds.VALIDATING_WEBHOOKS, webhooks.CONFIGURATION_NAME),
        ):
            kube.delete(kind, name)


def test_dev_mode_leaves_the_policy_so_a_labelled_vmi_is_refused_while_no_operator_serves(
    operator_kubeconfig: Path, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory, tmp_path: Path
) -> None:
    """§12.3: `cozygpu run --dev` takes its webhook configurations away when it stops but leaves the policy, which
    refuses a labelled VMI that no webhook of ours admitted (it lacks the mark) instead of letting it start
    without its GPUs; one admitted while the operator ran carries the mark."""
    gpu_node({gpu.resource: 1})
    process = start_admitting_operator(operator_kubeconfig, tmp_path)
    try:
        kube.create(kinds.GPU_DEVICE, gpu_device_body("held", namespace, gpu.cls))
        admitted = kube.create(kinds.VMI, vmi_body("served", namespace, [{"device": "held"}]))
        assert admitted["metadata"]["annotations"][ANNOTATION_ADMITTED] == "true"
    finally:
        process.stop()
    assert kube.get_or_none(kinds.MUTATING_WEBHOOKS, webhooks.MUTATING_NAME) is None
    assert kube.get_or_none(kinds.POLICY_BINDING, policy.NAME) is not None
    # Refused by both policies: the mark's, and the one that needs the mutating configuration (whose parameter the
    # API server finds missing); it reports whichever it evaluated first.
    message = refused(kube, kinds.VMI, vmi_body("unserved", namespace, [{"device": "held"}]))
    by_mark = "VMI unserved references GPUDevices but the VMI webhook of the GPU operator did not admit it"
    assert by_mark in message or f"ValidatingAdmissionPolicy '{policy.WEBHOOKS_NAME}'" in message


def forged(name: str, namespace: str, resource: str) -> Body:
    """A labelled VMI with the webhook's mark written by its creator, and a GPU entry of its own."""
    gpus = [{"name": "mine", "deviceName": resource}]
    domain = {"devices": {"gpus": gpus}, "resources": {"requests": {"memory": "1Gi"}}}
    body = vmi_body(name, namespace, [{"device": "held"}], domain=domain)
    body["metadata"]["annotations"][ANNOTATION_ADMITTED] = "true"
    return body


def test_a_forged_mark_gets_no_gpu_while_the_webhook_cannot_run(
    operator_kubeconfig: Path, kube: Kube, namespace: str, gpu: Gpu, tmp_path: Path
) -> None:
    """Issue 34 item 4, §12.3: with the mutating configuration gone, or its VMI webhook set to Ignore while no
    operator answers, a labelled VMI carrying the mark and a GPU entry of its own (which nothing would pin or count)
    is refused, and so is a launcher pod of a labelled VMI. Before, the mark let both through."""
    process = start_admitting_operator(operator_kubeconfig, tmp_path)
    process.stop()  # dev mode takes its configurations away and leaves the policies
    try:
        assert kube.get_or_none(kinds.MUTATING_WEBHOOKS, webhooks.MUTATING_NAME) is None
        missing = f"ValidatingAdmissionPolicy '{policy.WEBHOOKS_NAME}'"
        assert missing in refused(kube, kinds.VMI, forged("forged", namespace, gpu.resource))
        launcher = pod("virt-launcher-forged", namespace, "example.com/fpga", {"kubevirt.io": "virt-launcher"})
        launcher["metadata"]["labels"][LABEL_DEVICE_REFERENCE] = "true"
        assert missing in refused(kube, kinds.POD, launcher)
        (tmp_path / "again").mkdir()
        process = start_admitting_operator(operator_kubeconfig, tmp_path / "again")
        process.kill()  # its configuration stays, and no one answers it
        mutating = kube.get(kinds.MUTATING_WEBHOOKS, webhooks.MUTATING_NAME)
        for webhook in mutating["webhooks"]:
            webhook["failurePolicy"] = "Ignore"
        kube.replace(kinds.MUTATING_WEBHOOKS, mutating)
        message = refused(kube, kinds.VMI, forged("ignored", namespace, gpu.resource))
        assert "VMI ignored references GPUDevices, and the mutating webhook configuration of the GPU" in message
        assert "(it is missing, or its webhook was removed or set to Ignore)" in message
        launcher["metadata"]["name"] = "virt-launcher-ignored"
        assert "Pod virt-launcher-ignored, a launcher of a VMI that references GPUDevices" in refused(
            kube, kinds.POD, launcher
        )
        assert kube.get_or_none(kinds.VMI, "ignored", namespace) is None
    finally:
        process.kill()
        unregister_webhooks(kube)


def test_an_api_server_restart_refuses_nothing_the_guard_allows(
    control_plane: ControlPlane, operator_kubeconfig: Path, kube: Kube, namespace: str, gpu: Gpu, tmp_path: Path
) -> None:
    """§12.3: the policy's parameter is a core kind the operator keeps (the managed resources in a ConfigMap of
    its namespace): the first pod created after kube-apiserver restarts is admitted, and a pod asking for a
    managed resource is still refused. With GPUClasses as the parameter, a restarted API server refused every
    pod and VMI create in the cluster for some 30 s, until its discovery caught up with the CRD."""
    process = start_admitting_operator(operator_kubeconfig, tmp_path)
    try:
        published = wait_for(
            "the managed resources published",
            lambda: (
                gpu.resource
                in (
                    (
                        (
                            kube.get_or_none(kinds.kind("ConfigMap"), policy.MANAGED_RESOURCES, identity.NAMESPACE)
                            or {}
                        ).get("data")
                        or {}
                    ).get(policy.RESOURCES_KEY)
                    or ""
                ).split(",")
            ),
        )
        assert published
    finally:
        process.stop()  # the policy and its parameter stay
    faults.restart_apiserver(control_plane, down=1)
    assert kube.create(kinds.POD, pod("first", namespace, "cpu"))["metadata"]["name"] == "first"
    assert "only KubeVirt launcher pods" in refused(kube, kinds.POD, pod("sneaky-after", namespace, gpu.resource))


def test_a_namespace_label_exempts_nothing(admitting: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu) -> None:
    """§12.3: exemptions are by name from the operator's settings; a namespace labelled as the old exemption was
    (which anyone allowed to edit the namespace can do) is guarded like any other."""
    kube.patch(kinds.NAMESPACE, namespace, {"metadata": {"labels": {"gpu.cozystack.io/unmanaged-gpus": "true"}}})
    message = refused(kube, kinds.POD, pod("labelled", namespace, gpu.resource))
    assert "only KubeVirt launcher pods" in message


def test_the_readmes_hand_run_path_meets_every_rule(
    control_plane: ControlPlane, kube: Kube, namespace: str, gpu_node: GPUNodeFactory, tmp_path: Path
) -> None:
    """§12.4: `cozygpu run --dev` started with an administrator's kubeconfig runs as its own ServiceAccount, so the
    administrator's own held device in a namespace the class does not entitle is refused (§9.1)."""
    tag = uuid.uuid4().hex[:6]
    kube.create(
        kinds.GPU_CLASS,
        gpu_class_body(f"only-{tag}", f"example.com/only-{tag}", namespaceSelector={"matchLabels": {"entitled": tag}}),
    )
    gpu_node({f"example.com/only-{tag}": 1})  # before the operator starts: its first list has it
    process = OperatorProcess(control_plane.kubeconfig_path, tmp_path / "operator.log", "--dev").start()
    try:
        synced = process.events("operator.synced")
        assert synced[0]["identity"] == identity.USERNAME
        with pytest.raises(Forbidden) as raised:
            kube.create(kinds.GPU_DEVICE, gpu_device_body("mine", namespace, f"only-{tag}"))
        assert f"namespace {namespace} is not entitled to GPUClass only-{tag}" in raised.value.message
    finally:
        process.stop()
        kube.delete(kinds.GPU_CLASS, f"only-{tag}")


def test_a_gpu_holding_pods_kubevirt_label_and_controller_reference_cannot_change(
    admitting: OperatorProcess, kube: Kube, namespace: str
) -> None:
    """§6.7, issue 34 item 1: they tell whose guest a launcher runs; a tenant relabelling its launcher
    (`kubevirt.io=x`), or taking its VMI controller reference off, would hide a running guest and have its units
    given to another. The policy refuses both on a pod holding a managed resource, naming the pod; other labels
    change freely. Before, both were admitted."""
    g = fresh_gpu()
    vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": "vm"}
    owner = {**vmi, "uid": str(uuid.uuid4()), "controller": True}
    body = pod("virt-launcher-vm", namespace, g.resource, {"kubevirt.io": "virt-launcher"})
    body["metadata"]["ownerReferences"] = [owner]
    kube.create(kinds.POD, body)  # before any class names its resource: as old as the guard
    kube.create(kinds.GPU_CLASS, gpu_class_body(g.cls, g.resource))
    try:
        # Once the policy refuses a plain pod asking for the resource, it has learned the class from its parameter.
        refused(kube, kinds.POD, pod("probe", namespace, g.resource))
        with pytest.raises(Forbidden) as raised:
            kube.patch(kinds.POD, "virt-launcher-vm", {"metadata": {"labels": {"kubevirt.io": "x"}}}, namespace)
        message = raised.value.message
        assert f"Pod virt-launcher-vm holds {g.resource}" in message and "kubevirt.io label" in message
        changes = [{"labels": {"kubevirt.io": None}}, {"ownerReferences": [{**owner, "controller": False}]}]
        for change in [*changes, {"ownerReferences": None}]:
            with pytest.raises(Forbidden, match="controller reference tell whose guest it runs"):
                kube.patch(kinds.POD, "virt-launcher-vm", {"metadata": change}, namespace)
        kube.patch(kinds.POD, "virt-launcher-vm", {"metadata": {"labels": {"team": "a"}}}, namespace)
        stored = kube.get(kinds.POD, "virt-launcher-vm", namespace)["metadata"]
        assert stored["labels"] == {"kubevirt.io": "virt-launcher", "team": "a"}
        assert stored["ownerReferences"] == [owner]
    finally:
        kube.delete(kinds.POD, "virt-launcher-vm", namespace)
        kube.delete(kinds.GPU_CLASS, g.cls)
