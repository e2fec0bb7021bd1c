"""No bypass (§12.1, §12.3): the API server itself refuses managed GPUs taken behind the operator's back."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from cozygpu.api import kinds
from cozygpu.devcluster import identity
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.devcluster.harness import OperatorProcess, wait_for
from cozygpu.kube.adapter import ApiError, Body, Forbidden, Kube
from cozygpu.runtime import policy, webhooks
from tests.conftest import Gpu, GPUNodeFactory, start_admitting_operator
from tests.helpers import gpu_class_body, gpu_device_body, vmi_body


def unlabelled_vmi(name: str, namespace: str, devices: dict[str, Any] | None = None, **domain: Any) -> Body:
    """A VMI without device references, with GPU entries of its own."""
    body = vmi_body(name, namespace, None, domain={"devices": devices or {}, "resources": domain.get("resources",
                    {"requests": {"memory": "1Gi"}})})  # fmt: skip
    del body["metadata"]["labels"]["gpu.cozystack.io/device-reference"]
    return body


def pod(name: str, namespace: str, resource: str, labels: dict[str, str] | None = None) -> Body:
    asks = {resource: "1"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace,
            "labels": labels or {}}, "spec": {"containers": [{"name": "c", "image": "registry.invalid/x",
            "resources": {"requests": asks, "limits": asks}}]}}  # fmt: skip


def refused(kube: Kube, kind: kinds.Kind, body: Body) -> str:
    """The policy's refusal, once the API server has the policy's parameters (it reads GPUClasses from a watch)."""

    def attempt() -> str | None:
        try:
            created = kube.create(kind, body)
        except ApiError as e:
            if e.status not in (403, 422):
                raise
            return e.message
        kube.delete(kind, created["metadata"]["name"], created["metadata"]["namespace"])
        return None

    return wait_for(f"{body['kind']} {body['metadata']['name']} refused", attempt, timeout=15)


def test_a_vmi_without_device_references_naming_a_managed_resource_is_refused(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu
) -> None:
    """§12.1: in gpus, hostDevices or resources alike; the message names the resource, its class and the way in."""
    shapes = [
        {"devices": {"gpus": [{"name": "g", "deviceName": gpu.resource}]}},
        {"devices": {"hostDevices": [{"name": "h", "deviceName": gpu.resource}]}},
        {"resources": {"requests": {"memory": "1Gi"}, "limits": {gpu.resource: "1"}}},
    ]
    for i, shape in enumerate(shapes):
        message = refused(kube, kinds.VMI, unlabelled_vmi(f"direct-{i}", namespace, **shape))
        assert f"VMI direct-{i} names {gpu.resource}, the resource of GPUClass {gpu.cls}, directly" in message
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
    assert f"Pod sneaky asks for {gpu.resource}, the resource of GPUClass {gpu.cls}" in message
    assert "only KubeVirt launcher pods" in message


def test_the_guard_holds_while_the_operator_is_down(
    operator_kubeconfig: Path, kube: Kube, namespace: str, gpu: Gpu, tmp_path: Path
) -> None:
    """§12.3: the operator killed outright (nothing unregistered), the API server still refuses on its own."""
    process = start_admitting_operator(operator_kubeconfig, tmp_path)
    try:
        assert kube.get(kinds.POLICY, policy.NAME)["spec"]["paramKind"]["kind"] == "GPUClass"
        process.kill()
        message = refused(kube, kinds.POD, pod("while-down", namespace, gpu.resource))
        assert "only KubeVirt launcher pods" in message
        body = unlabelled_vmi("while-down", namespace, {"gpus": [{"name": "g", "deviceName": gpu.resource}]})
        assert "directly" in refused(kube, kinds.VMI, body)
    finally:
        process.kill()
        for kind, name in ((kinds.MUTATING_WEBHOOKS, webhooks.CONFIGURATION_NAME),
                           (kinds.VALIDATING_WEBHOOKS, webhooks.CONFIGURATION_NAME),
                           (kinds.POLICY_BINDING, policy.NAME), (kinds.POLICY, policy.NAME)):  # fmt: skip
            kube.delete(kind, name)


def test_dev_mode_removes_the_policy_on_exit(operator_kubeconfig: Path, kube: Kube, tmp_path: Path) -> None:
    """`cozygpu run --dev` registers the policy and its binding, and takes them away when it stops."""
    process = start_admitting_operator(operator_kubeconfig, tmp_path)
    assert kube.get_or_none(kinds.POLICY_BINDING, policy.NAME) is not None
    process.stop()
    assert kube.get_or_none(kinds.POLICY, policy.NAME) is None
    assert kube.get_or_none(kinds.POLICY_BINDING, policy.NAME) is None


def test_the_readmes_hand_run_path_meets_every_rule(
    control_plane: ControlPlane, kube: Kube, namespace: str, gpu_node: GPUNodeFactory, tmp_path: Path
) -> None:
    """§12.4: `cozygpu run --dev` started with an administrator's kubeconfig runs as its own ServiceAccount, so the
    administrator's own held device in a namespace the class does not entitle is refused (§9.1)."""
    tag = uuid.uuid4().hex[:6]
    kube.create(kinds.GPU_CLASS, gpu_class_body(f"only-{tag}", f"example.com/only-{tag}",
                                                namespaceSelector={"matchLabels": {"entitled": tag}}))  # fmt: skip
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
