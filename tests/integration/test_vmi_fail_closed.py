"""§3: when the API fails the webhook, a labelled VMI gets an error (HTTP 500), never an admission.

The operator runs as a user whose RBAC lets it list and watch everything but not
`get` GPUDevices, so the fresh read of §3.3 fails the way an API outage would.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.devcluster.harness import OperatorProcess
from cozygpu.kube import kinds
from cozygpu.kube.adapter import ApiError, Kube
from tests.conftest import Gpu, GPUNodeFactory
from tests.helpers import gpu_device_body, leftovers, vmi_body

pytestmark = pytest.mark.integration

USER = "cozy-gpu-no-get"
ROLE = "test-cozy-gpu-no-get"

# Everything the operator does, except reading one GPUDevice: RBAC is additive, so `get`
# is granted resource by resource, leaving gpudevices out.
RULES = [
    {"apiGroups": ["*"], "resources": ["*"], "verbs": ["list", "watch", "create", "update", "patch", "delete"]},
    {
        "apiGroups": ["", "gpu.cozystack.io", "kubevirt.io", "admissionregistration.k8s.io"],
        "resources": ["nodes", "namespaces", "gpuclasses", "gpubudgets", "gpunodes", "kubevirts",
                      "virtualmachineinstances", "mutatingwebhookconfigurations", "validatingwebhookconfigurations"],
        "verbs": ["get"],
    },
]  # fmt: skip


@pytest.fixture(scope="module")
def blind(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """The operator with webhooks, unable to read GPUDevices one by one."""
    kube = control_plane.kube()
    kube.create(kinds.kind("ClusterRole"), {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                                            "metadata": {"name": ROLE}, "rules": RULES})  # fmt: skip
    kube.create(kinds.kind("ClusterRoleBinding"), {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": ROLE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ROLE},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}]})  # fmt: skip
    directory = Path(tmp_path_factory.mktemp("blind"))
    kubeconfig = control_plane.write_kubeconfig(directory / "kubeconfig", user=USER, group=None)
    process = OperatorProcess(kubeconfig, directory / "operator.log", "--dev", "--bind-timeout", "2").start()
    yield process
    process.stop()
    for kind in (kinds.MUTATING_WEBHOOKS, kinds.VALIDATING_WEBHOOKS):
        kube.delete(kind, "cozy-gpu-operator")
    kube.delete(kinds.kind("ClusterRoleBinding"), ROLE)
    kube.delete(kinds.kind("ClusterRole"), ROLE)


def test_an_api_failure_is_an_error_and_the_vmi_is_not_created(
    blind: OperatorProcess, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory
) -> None:
    """The fresh read is forbidden: the API server answers 500 with our message, stores no VMI, and we log it."""
    gpu_node({gpu.resource: 1}, name=f"blind-{gpu.cls}")
    kube.create(kinds.GPU_DEVICE, gpu_device_body("h", namespace, gpu.cls))
    with pytest.raises(ApiError) as raised:
        kube.create(kinds.VMI, vmi_body("vm", namespace, [{"device": "h"}]))
    assert raised.value.status == 500, raised.value.message
    assert f"the GPU operator could not check the VMI: reading GPUDevice {namespace}/h" in raised.value.message
    assert kube.get_or_none(kinds.VMI, "vm", namespace) is None
    assert leftovers(kube, namespace, "vm") == []
    [error] = [e for e in blind.events("vmi.error") if e.get("namespace") == namespace]
    assert error["vmi"] == "vm"
    assert not [e for e in blind.events("vmi.refused") if e.get("namespace") == namespace]
