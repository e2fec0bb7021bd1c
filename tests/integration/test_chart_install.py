"""helm install, upgrade and uninstall for real, against an API server (issue 23 items 1 and 6; §10).

A control plane of the module's own: without our CRDs (the chart brings them), and routing webhook calls to a
Service's endpoints, as a cluster's API server reaches the chart's webhooks. No kubelet runs, so the Deployment's
pods never start; the operator runs from the venv as one of them would (tests/support/release.py): the release's
ServiceAccount token, its generated certificate, its Deployment's environment, behind its Service. Whatever it
syncs, serves and binds, the chart's RBAC allowed.

The previous chart is the one on main before issue 23 (PREVIOUS, taken from git): version 0.1.0 like this one (no
release has bumped it), but without CRDs, schema or notes, its docs saying `kubectl apply -f crds/` first. That is
the upgrade platform teams make.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cozygpu.api import kinds
from cozygpu.devcluster import binaries, nodes
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import ApiError, Kube
from cozygpu.runtime.admission import webhooks
from cozygpu.settings import Settings
from tests.support import faults
from tests.support.bodies import gpu_class_body, gpu_device_body, unique, vmi_body
from tests.support.harness import OperatorProcess, wait_for
from tests.support.helm import CHART, NAMESPACE, RELEASE, Helm
from tests.support.nodes import fresh_gpu
from tests.support.release import host_address, start_pod

pytestmark = pytest.mark.integration

PREVIOUS = "ee696897f1dda07542c60536704c8a409dae00d8"  # main before issue 23: chart 0.1.0 as installed today
CHART_CRDS = sorted((CHART / "crds").glob("*.yaml"))
WEBHOOKS = (kinds.MUTATING_WEBHOOKS, kinds.VALIDATING_WEBHOOKS)

# Before each upgrade (docs/operating.md): `helm show crds <chart> | kubectl apply <these> -f -`.
CRD_STEP = ("apply", "--server-side", "--field-manager=helm", "--force-conflicts", "-f", "-")


def configuration(kind: kinds.Kind, previous: bool = False) -> str:
    """The release's configuration of `kind`: the mutating one's name sorts after KubeVirt's (not before this
    chart)."""
    return f"{webhooks.MUTATING_PREFIX}{RELEASE}" if kind is kinds.MUTATING_WEBHOOKS and not previous else RELEASE


@pytest.fixture(scope="module")
def address() -> str:
    found = host_address()
    if found is None:
        pytest.skip("no address but loopback here: an EndpointSlice, the API server's way to the webhook, needs one")
    return found


@pytest.fixture(scope="module")
def plane(address: str) -> Iterator[ControlPlane]:
    with ControlPlane(ours=False, apiserver_flags=("--enable-aggregator-routing=true",)) as plane:
        yield plane


@pytest.fixture
def helm(plane: ControlPlane, tmp_path: Path) -> Iterator[Helm]:
    """helm with the plane's admin kubeconfig; the release is gone after the test, whatever happened."""
    helm = Helm(tmp_path / "helm", plane.kubeconfig_path)
    yield helm
    helm.attempt("uninstall", RELEASE, "--namespace", NAMESPACE, "--ignore-not-found")


@pytest.fixture
def pods() -> Iterator[list[OperatorProcess]]:
    """Operator processes a test started; stopped before the release goes."""
    running: list[OperatorProcess] = []
    yield running
    for process in running:
        process.stop()


def kubectl(plane: ControlPlane, *args: str, stdin: str | None = None) -> str:
    binary = binaries.find(("kubectl",)) / "kubectl"
    done = subprocess.run(
        [str(binary), "--kubeconfig", str(plane.kubeconfig_path), *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def install(helm: Helm, chart: Path, address: str, verb: str = "install") -> str:
    """helm install (or upgrade) into the release namespace, the API server's calls coming from this host."""
    return helm.run(
        verb,
        RELEASE,
        str(chart),
        "--namespace",
        NAMESPACE,
        "--create-namespace",
        "--set",
        f"networkPolicy.apiServer.cidrs={{{address}/32}}",
    )


def released(helm: Helm) -> list[dict[str, Any]]:
    """The release's objects, as helm recorded them."""
    out = helm.run("get", "manifest", RELEASE, "--namespace", NAMESPACE)
    return [d for d in yaml.safe_load_all(out) if d]


def stored(kube: Kube, doc: dict[str, Any]) -> dict[str, Any] | None:
    return kube.get_or_none(kinds.kind(doc["kind"]), doc["metadata"]["name"], doc["metadata"].get("namespace"))


def schema_of(crd: dict[str, Any]) -> Any:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def served(schema: Any) -> Any:
    """A CRD's schema as the API server keeps it: without empty `properties` (GPUNode's spec has none)."""
    if isinstance(schema, dict):
        return {k: served(v) for k, v in schema.items() if not (k == "properties" and v == {})}
    return [served(v) for v in schema] if isinstance(schema, list) else schema


def tenant(kube: Kube) -> str:
    name = unique("tenant")
    kube.create(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


def bound(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    """The device's status once the binder has placed it."""
    return wait_for(
        f"GPUDevice {namespace}/{name} Bound",
        lambda: (s := kube.get(kinds.GPU_DEVICE, name, namespace).get("status", {})).get("phase") == "Bound" and s,
    )


def leader(kube: Kube) -> str | None:
    lease = kube.get_or_none(kinds.kind("Lease"), Settings.model_fields["lease_name"].default, NAMESPACE) or {}
    holder: str | None = lease.get("spec", {}).get("holderIdentity")
    return holder


def held(status: dict[str, Any]) -> tuple[Any, ...]:
    """What a tenant's held device is: its phase, its node, the VMI it is attached to."""
    return status["phase"], status["nodeName"], (status.get("attachedTo") or {}).get("vmi")


def test_install_creates_the_crds_and_every_object_and_the_charts_rbac_suffices(
    plane: ControlPlane, helm: Helm, pods: list[OperatorProcess], address: str, tmp_path: Path
) -> None:
    """On a cluster without them, helm install creates the CRDs (established, as generated) and every object of the
    release, the webhooks registered with the generated CA. The operator as the chart's ServiceAccount, with the
    Deployment's settings, syncs, takes the Lease, keeps the no-bypass policy's ConfigMap, answers the admissions
    the API server sends through the Service, and binds a tenant's device. helm uninstall then removes every
    object of the release and leaves the CRDs and the tenant's device as they were."""
    kube = plane.kube()
    assert not [c for c in kube.list(kinds.CRD) if c["spec"]["group"] == "gpu.cozystack.io"]
    notes = install(helm, CHART, address)
    assert "is installed: release" in notes and f"rollout status deployment/{RELEASE}" in notes
    for path in CHART_CRDS:
        ours = yaml.safe_load(path.read_text())
        crd = kube.get(kinds.CRD, ours["metadata"]["name"])
        assert schema_of(crd) == served(schema_of(ours))
        assert {"type": "Established", "status": "True"}.items() <= next(
            c for c in crd["status"]["conditions"] if c["type"] == "Established"
        ).items()
    docs = released(helm)
    assert {d["kind"] for d in docs} >= {
        "Deployment",
        "Service",
        "Secret",
        "ClusterRole",
        "Role",
        "MutatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
    }
    assert all(stored(kube, d) is not None for d in docs), [d["metadata"]["name"] for d in docs if not stored(kube, d)]
    ca = kube.get(kinds.kind("Secret"), f"{RELEASE}-webhook-tls", NAMESPACE)["data"]["ca.crt"]
    for kind in WEBHOOKS:
        hooks = kube.get(kind, configuration(kind))["webhooks"]
        assert {(h["clientConfig"]["caBundle"], h["clientConfig"]["service"]["name"]) for h in hooks} == {(ca, RELEASE)}

    pods.append(start_pod(plane, RELEASE, NAMESPACE, "pod-a", address, tmp_path / "pod-a"))
    wait_for("pod-a to lead", lambda: leader(kube) == "pod-a")
    wait_for(
        "the managed resources ConfigMap",
        lambda: kube.get_or_none(kinds.kind("ConfigMap"), "cozy-gpu-managed-resources", NAMESPACE),
    )
    gpu, namespace = fresh_gpu(), tenant(kube)
    kube.create(kinds.GPU_CLASS, gpu_class_body(gpu.cls, gpu.resource))  # through the validating webhook
    with pytest.raises(ApiError, match="GPUClass no-such-class does not exist"):
        kube.create(kinds.GPU_DEVICE, gpu_device_body("d", namespace, "no-such-class"))
    node = unique("gpu-node")
    nodes.create_gpu_node(kube, node, {gpu.resource: 2})
    kube.create(kinds.GPU_DEVICE, gpu_device_body("held", namespace, gpu.cls))
    assert held(bound(kube, namespace, "held")) == ("Bound", node, None)
    wait_for(f"GPUNode {node}", lambda: kube.get_or_none(kinds.GPU_NODE, node))
    pods.pop().stop()

    helm.run("uninstall", RELEASE, "--namespace", NAMESPACE)
    assert [d["metadata"]["name"] for d in docs if stored(kube, d) is not None] == []
    for path in CHART_CRDS:
        assert kube.get_or_none(kinds.CRD, yaml.safe_load(path.read_text())["metadata"]["name"]) is not None
    assert held(kube.get(kinds.GPU_DEVICE, "held", namespace)["status"]) == ("Bound", node, None)
    assert kube.get_or_none(kinds.kind("ConfigMap"), "cozy-gpu-managed-resources", NAMESPACE)  # the operator's


def previous_chart(directory: Path) -> Path:
    """The chart and CRDs at PREVIOUS, from this checkout's git history."""
    git = ["git", "-C", str(binaries.repo_root()), "archive", PREVIOUS, "charts/cozy-gpu-operator", "crds"]
    done = subprocess.run(git, capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"no git history with the previous chart ({PREVIOUS[:8]}): {done.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as archive:
        archive.extractall(directory, filter="data")
    assert not (directory / "charts" / "cozy-gpu-operator" / "crds").exists()  # what this upgrade is about
    return directory


def test_upgrade_from_the_previous_chart_keeps_the_certificate_and_the_held_devices(
    plane: ControlPlane, helm: Helm, pods: list[OperatorProcess], address: str, tmp_path: Path
) -> None:
    """The chart of before issue 23 installed as its docs said (CRDs by kubectl first), a tenant's device held and
    attached to a VMI admitted through the Service. Then the documented CRD step and helm upgrade to this chart:
    the generated certificate stays (Secret and caBundles), the device stays Bound on its node and attached, and
    a pod of the upgraded Deployment serves through the Service with that certificate and binds a new VMI's
    template device. helm uninstall leaves the devices where they are."""
    # The module's first test uninstalled a release, binding and all: the API server no longer sees the policy's
    # parameter change (kubernetes/kubernetes#130887), so no class created after could be Ready. What
    # docs/admission.md tells a platform to do after an uninstall, done here.
    faults.restart_apiserver(plane)
    kube = plane.kube()
    previous = previous_chart(tmp_path / "previous")
    kubectl(plane, "apply", "-f", str(previous / "crds"))
    install(helm, previous / "charts" / "cozy-gpu-operator", address)
    # This checkout's code stands in for the previous release, whose policy cannot answer the guard's probe (§12.3):
    # it runs as that release did, with no class readiness.
    old = {"COZYGPU_NO_BYPASS_POLICY": "false"}
    pods.append(start_pod(plane, RELEASE, NAMESPACE, "old-pod", address, tmp_path / "old-pod", old))
    wait_for("the old pod to lead", lambda: leader(kube) == "old-pod")
    gpu, namespace, node = fresh_gpu(), tenant(kube), unique("gpu-node")
    kube.create(kinds.GPU_CLASS, gpu_class_body(gpu.cls, gpu.resource))
    nodes.create_gpu_node(kube, node, {gpu.resource: 2})
    kube.create(kinds.GPU_DEVICE, gpu_device_body("held", namespace, gpu.cls))
    bound(kube, namespace, "held")
    kube.create(kinds.VMI, vmi_body("vm", namespace, [{"device": "held"}]))
    holding = held(
        wait_for(
            "the device attached to its VMI",
            lambda: (s := kube.get(kinds.GPU_DEVICE, "held", namespace)["status"]).get("attachedTo") and s,
        )
    )
    assert holding == ("Bound", node, "vm")
    secret = kube.get(kinds.kind("Secret"), f"{RELEASE}-webhook-tls", NAMESPACE)["data"]
    before = {kind: kube.get(kind, configuration(kind, previous=True))["webhooks"] for kind in WEBHOOKS}
    bundles = {kind.kind: [h["clientConfig"]["caBundle"] for h in hooks] for kind, hooks in before.items()}

    kubectl(plane, *CRD_STEP, stdin=helm.run("show", "crds", str(CHART)))
    notes = install(helm, CHART, address, verb="upgrade")
    assert "is upgraded: release" in notes
    assert kube.get(kinds.kind("Secret"), f"{RELEASE}-webhook-tls", NAMESPACE)["data"] == secret
    assert {
        kind.kind: [h["clientConfig"]["caBundle"] for h in kube.get(kind, configuration(kind))["webhooks"]]
        for kind in WEBHOOKS
    } == bundles
    assert kube.get_or_none(kinds.MUTATING_WEBHOOKS, RELEASE) is None  # renamed: the old one went with the upgrade
    assert held(kube.get(kinds.GPU_DEVICE, "held", namespace)["status"]) == holding

    pods.pop().stop()  # the rollout: the old pod goes, a pod of the upgraded Deployment comes
    pods.append(start_pod(plane, RELEASE, NAMESPACE, "new-pod", address, tmp_path / "new-pod"))
    wait_for("the new pod to lead", lambda: leader(kube) == "new-pod")
    vm2 = kube.create(kinds.VMI, vmi_body("vm2", namespace, [{"deviceTemplate": {"className": gpu.cls, "count": 1}}]))
    assert vm2["spec"]["domain"]["devices"]["gpus"] == [{"name": "gpudev0-0", "deviceName": gpu.resource}]
    assert held(bound(kube, namespace, "vm2-gpu-0")) == ("Bound", node, "vm2")
    assert held(kube.get(kinds.GPU_DEVICE, "held", namespace)["status"]) == holding
    pods.pop().stop()

    helm.run("uninstall", RELEASE, "--namespace", NAMESPACE)
    assert kube.get_or_none(kinds.MUTATING_WEBHOOKS, configuration(kinds.MUTATING_WEBHOOKS)) is None
    assert held(kube.get(kinds.GPU_DEVICE, "held", namespace)["status"]) == holding
    assert held(kube.get(kinds.GPU_DEVICE, "vm2-gpu-0", namespace)["status"]) == ("Bound", node, "vm2")


def test_helm_upgrade_leaves_an_older_crd_and_the_documented_step_upgrades_it(
    plane: ControlPlane, helm: Helm, address: str
) -> None:
    """Helm never upgrades a chart's crds/ on upgrade: with the GPUClass CRD as an older chart's install left it
    (before spec.idleMoves), helm upgrade leaves it so. The step docs/operating.md gives before each upgrade,
    `helm show crds <chart> | kubectl apply --server-side --field-manager=helm --force-conflicts -f -`, makes every
    CRD the chart's and leaves them Helm's own: helm install, which (Helm 4) applies crds/ server-side on every
    install, then runs again after an uninstall without a conflict (with kubectl's own field manager it fails)."""
    kube = plane.kube()
    install(helm, CHART, address)
    ours = yaml.safe_load((CHART / "crds" / "gpu.cozystack.io_gpuclasses.yaml").read_text())
    older = yaml.safe_load(yaml.safe_dump(ours))
    del schema_of(older)["properties"]["spec"]["properties"]["idleMoves"]
    kubectl(
        plane,
        "apply",
        "--server-side",
        "--field-manager=helm",
        "--force-conflicts",
        "-f",
        "-",
        stdin=yaml.safe_dump(older),
    )  # the CRD as the older chart's install applied it
    install(helm, CHART, address, verb="upgrade")
    assert schema_of(kube.get(kinds.CRD, ours["metadata"]["name"])) == served(schema_of(older))
    kubectl(plane, *CRD_STEP, stdin=helm.run("show", "crds", str(CHART)))
    for path in CHART_CRDS:
        crd = yaml.safe_load(path.read_text())
        stored_crd = kube.get(kinds.CRD, crd["metadata"]["name"])
        assert schema_of(stored_crd) == served(schema_of(crd)), path.name
        assert {m["manager"] for m in stored_crd["metadata"]["managedFields"] if m["operation"] == "Apply"} == {"helm"}
    helm.run("uninstall", RELEASE, "--namespace", NAMESPACE)
    install(helm, CHART, address)
