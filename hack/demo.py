"""`make demo`: a local control plane with fake GPU nodes, the operator, and a short story.

Starts etcd and kube-apiserver (with our CRDs and KubeVirt's) and, where KubeVirt can be
had (hack/build-kubevirt.sh), KubeVirt's own virt-api and virt-controller with
kube-scheduler and a fake kubelet (§11.1); two fake GPU nodes and `cozygpu run --dev`
(webhooks registered against the local API server). A tenant creates held devices and
the binder places them. With KubeVirt: a VM naming two held devices and a template
entry starts on one node, stops, and starts again on the same GPUs; a VM asking for a
taken device shows the refusal on its status. Without KubeVirt the same story is told
with VMIs created directly, and the demo says so. Everything stops at the end, unless
DEMO_KEEP=1 (`make demo DEMO_KEEP=1`) keeps it running until Ctrl-C, with a real Prometheus
scraping the operator as the chart's ServiceMonitor would (issue 23; where Debian's prometheus
package is installed) for trying the chart's dashboard and alert queries; the logs and the
kubeconfig stay in .dev/demo/ for a second look either way.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' harness: the operator in a process

from tests.support.harness import OperatorProcess, wait_for

from cozygpu.api import kinds
from cozygpu.api.names import API_VERSION
from cozygpu.devcluster import binaries, identity, nodes, prometheus
from cozygpu.devcluster.bodies import vmi_body
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import ApiError, Kube

A10 = "nvidia.com/GA102GL_A10"
NS = "tenant-demo"
# What a second look needs, kept after the demo: the operator's log, the control plane's logs, kubeconfigs.
HERE = Path(".dev/demo").resolve()


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def device(name: str, count: int) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "GPUDevice",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"className": "a10", "count": count},
    }


def vm_body(name: str, refs: list[dict[str, Any]]) -> dict[str, Any]:
    """A VM as a tenant writes it: KubeVirt copies the template's label and annotation onto each VMI. Its eviction
    strategy is External: off a node being drained, the operator restarts it elsewhere with its GPUs (§6.8)."""
    template = vmi_body(name, NS, refs)
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "runStrategy": "Always",
            "template": {
                "metadata": {k: template["metadata"][k] for k in ("labels", "annotations")},
                "spec": {**template["spec"], "terminationGracePeriodSeconds": 0, "evictionStrategy": "External"},
            },
        },
    }


def show_devices(kube: Kube) -> None:
    print(f"{'DEVICE':<16}{'COUNT':<7}{'PHASE':<9}{'NODE':<8}MESSAGE")
    for d in sorted(kube.list(kinds.GPU_DEVICE, NS), key=lambda d: d["metadata"]["name"]):
        s = d.get("status", {})
        print(
            f"{d['metadata']['name']:<16}{d['spec']['count']:<7}{s.get('phase', ''):<9}"
            f"{s.get('nodeName', ''):<8}{s.get('message', '')}"
        )


def bound(kube: Kube, name: str) -> bool:
    return kube.get(kinds.GPU_DEVICE, name, NS).get("status", {}).get("phase") == "Bound"


def refused(e: ApiError) -> str:
    return e.message.split("denied the request: ")[-1]


def running_on(kube: Kube, name: str) -> str | None:
    """The node of the VM's running VMI, once its launcher pod runs there."""
    vmi = kube.get_or_none(kinds.VMI, name, NS)
    if vmi is None or vmi.get("status", {}).get("phase") != "Running":
        return None
    node: str | None = vmi["status"].get("nodeName")
    return node


def vm_story(kube: Kube) -> None:
    """The tenant's view through KubeVirt: VMs start, stop and start again on the same GPUs."""
    refs = [{"device": "train-a"}, {"device": "train-b"}, {"deviceTemplate": {"className": "a10", "count": 1}}]
    say("a VM names train-a, train-b and a template GPU; virt-controller makes its VMI through our webhook")
    kube.create(kinds.VM, vm_body("trainer", refs))
    node = wait_for("trainer running", lambda: running_on(kube, "trainer"), timeout=60)
    vmi = kube.get(kinds.VMI, "trainer", NS)
    print("gpus:", ", ".join(f"{g['name']}={g['deviceName']}" for g in vmi["spec"]["domain"]["devices"]["gpus"]))
    pods = kube.list(kinds.POD, NS, label_selector=f"kubevirt.io/created-by={vmi['metadata']['uid']}")
    print(
        f"VM trainer runs on {node}; its launcher pod {pods[0]['metadata']['name']} was bound there by "
        f"kube-scheduler, pinned by the operator's pod webhook"
    )
    show_devices(kube)

    say("the tenant stops the VM: the template GPU goes, train-a and train-b stay held on their node")
    kube.patch(kinds.VM, "trainer", {"spec": {"runStrategy": "Halted"}}, NS)
    wait_for("trainer stopped", lambda: kube.get_or_none(kinds.VMI, "trainer", NS) is None, timeout=60)
    wait_for("template device gone", lambda: kube.get_or_none(kinds.GPU_DEVICE, "trainer-gpu-2", NS) is None)
    show_devices(kube)

    say("and starts it again: the same GPUs, on the same node")
    kube.patch(kinds.VM, "trainer", {"spec": {"runStrategy": "Always"}}, NS)
    again = wait_for("trainer running again", lambda: running_on(kube, "trainer"), timeout=60)
    print(f"VM trainer runs on {again} again")

    say("another VM asks for train-a, which trainer holds: KubeVirt shows the refusal on the VM")
    kube.create(kinds.VM, vm_body("intruder", [{"device": "train-a"}]))

    def failure() -> str | None:
        conditions = kube.get(kinds.VM, "intruder", NS).get("status", {}).get("conditions") or []
        return next((c["message"] for c in conditions if c["type"] == "Failure"), None)

    print("VM intruder, condition Failure:", wait_for("intruder refused", failure).split("denied the request: ")[-1])


def drain_story(kube: Kube) -> None:
    """Node maintenance (§6.8): the platform drains trainer's node; the VM runs again elsewhere with its GPUs."""
    home = running_on(kube, "trainer")
    assert home is not None
    say(f"a third node joins, and the platform drains {home} as `kubectl drain` does: cordon, then evict each pod")
    nodes.create_gpu_node(kube, "gpu-c", {A10: 4}, labels={"gpu": "a10"}, kubevirt=True)
    kube.patch(kinds.NODE, home, {"spec": {"unschedulable": True}})
    old = kube.get(kinds.VMI, "trainer", NS)["metadata"]["uid"]
    said: list[str] = []

    def drained() -> bool:
        pods = [p for p in kube.list(kinds.POD, NS) if p["spec"].get("nodeName") == home]
        for pod in pods:
            answer = kube.evict(pod["metadata"]["name"], NS)
            if answer not in ("evicted", "gone") and answer not in said:
                said.append(answer)
                print(f"eviction of {pod['metadata']['name']} refused for now: {answer.split(': ', 1)[-1]}")
        return not pods

    wait_for(f"{home} drained", drained, timeout=120)

    def again() -> str | None:
        vmi = kube.get_or_none(kinds.VMI, "trainer", NS)
        return running_on(kube, "trainer") if vmi is not None and vmi["metadata"]["uid"] != old else None

    node = wait_for("trainer running again", again, timeout=120)
    print(f"{home} drained; VM trainer runs again on {node} with the same GPUDevices")
    moved = wait_for(
        f"GPUNode {home} counting", lambda: (kube.get(kinds.GPU_NODE, home).get("status") or {}).get("evacuated")
    )
    print(f"GPUNode {home}: {moved} VM{'' if moved == 1 else 's'} moved off it while cordoned (status.evacuated)")
    show_devices(kube)
    for event in kube.list(kinds.kind("Event"), NS):
        if event.get("reason") == "Moved" and "node maintenance" in event.get("message", ""):
            print(f"Event Moved on {event['involvedObject']['name']}: {event['message']}")


def vmi_story(kube: Kube) -> None:
    """The same story with VMIs created directly, where KubeVirt's controllers are not available."""
    say("a VMI names train-a, train-b and a template GPU: the set is gathered on one node")
    refs = [{"device": "train-a"}, {"device": "train-b"}, {"deviceTemplate": {"className": "a10", "count": 1}}]
    vmi = kube.create(kinds.VMI, vmi_body("trainer", NS, refs))
    pin = vmi["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    print("gpus:", ", ".join(f"{g['name']}={g['deviceName']}" for g in vmi["spec"]["domain"]["devices"]["gpus"]))
    print("pinned to:", pin["nodeSelectorTerms"][0]["matchFields"][0]["values"][0])
    show_devices(kube)

    say("another VMI asks for train-a, which trainer holds: refused, with the reason")
    try:
        kube.create(kinds.VMI, vmi_body("intruder", NS, [{"device": "train-a"}]))
    except ApiError as e:
        print(f"refused: {refused(e)}")


def control_plane() -> ControlPlane:
    """Started, with KubeVirt in the loop where it can be had; without, saying why."""
    plane = ControlPlane(kubevirt=True, workdir=HERE / "control-plane")
    try:
        plane.start(timeout=180)
        return plane
    except binaries.KubeVirtUnavailable as e:
        print(f"{e}\nthe demo goes on with VMIs created directly, without KubeVirt's controllers", flush=True)
    shutil.rmtree(HERE / "control-plane", ignore_errors=True)
    plane = ControlPlane(workdir=HERE / "control-plane")
    plane.start()
    return plane


def main() -> int:
    say("starting etcd and kube-apiserver on loopback (and KubeVirt's controllers, where they can be had)")
    shutil.rmtree(HERE, ignore_errors=True)  # the last demo's logs and data
    plane = control_plane()
    with contextlib.ExitStack() as stack:
        stack.callback(plane.stop)
        kubeconfig = plane.write_kubeconfig(HERE / "kubeconfig")
        kube = plane.kube()
        with_kubevirt = plane.kubevirt is not None
        print(f"API server {plane.server}; kubeconfig {kubeconfig}")
        print(
            "KubeVirt in the loop: virt-api, virt-controller, kube-scheduler, a fake kubelet"
            if with_kubevirt
            else "KubeVirt's controllers are not running: VMIs are created directly"
        )

        say("two fake GPU nodes with GPUs in status.allocatable, and a GPUClass")
        for name, count in (("gpu-a", 2), ("gpu-b", 6)):
            nodes.create_gpu_node(kube, name, {A10: count}, labels={"gpu": "a10"}, kubevirt=with_kubevirt)
            print(f"node {name}: {count} x {A10}")
        kube.create(
            kinds.GPU_CLASS,
            {
                "apiVersion": API_VERSION,
                "kind": "GPUClass",
                "metadata": {"name": "a10"},
                "spec": {"mode": "passthrough", "resourceName": A10, "nodeSelector": {"gpu": "a10"}},
            },
        )
        kube.create(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})

        say("starting the operator (cozygpu run --dev) as its ServiceAccount, with the chart's RBAC only")
        operator_config = identity.write_kubeconfig(plane, HERE / "operator")
        operator = OperatorProcess(operator_config, HERE / "operator.log", "--dev").start()
        try:
            print(f"ready: http://127.0.0.1:{operator.port}/readyz")
            server = scraping(operator, kube) if os.environ.get("DEMO_KEEP") == "1" else None
            if server is not None:
                stack.callback(server.stop)

            say("the tenant holds GPUs: two devices of 1 unit and one of 3; the binder packs them")
            for name, count in (("train-a", 1), ("train-b", 1), ("big", 3)):
                kube.create(kinds.GPU_DEVICE, device(name, count))
            wait_for("devices placed", lambda: all(bound(kube, n) for n in ("train-a", "train-b", "big")))
            show_devices(kube)

            say("the operator's webhook refuses a device no node could ever hold")
            try:
                kube.create(kinds.GPU_DEVICE, device("enormous", 9))
            except ApiError as e:
                print(f"refused: {refused(e)}")

            if with_kubevirt:
                vm_story(kube)
                drain_story(kube)
            else:
                vmi_story(kube)

            accounting(kube, operator, 3 if with_kubevirt else 2)
            if os.environ.get("DEMO_KEEP") == "1":
                keep(kubeconfig, operator.log_path, server)
        finally:
            operator.stop()
        say("stopping the operator and the control plane")
    second_look()
    print("done")
    return 0


def accounting(kube: Kube, operator: OperatorProcess, gpunodes: int) -> None:
    """What the platform reads: each node's GPUNode, and the operator's decisions as it logged them."""
    say("GPUNodes: what each node holds")
    wait_for("accounting", lambda: len(kube.list(kinds.GPU_NODE)) == gpunodes)
    for gn in sorted(kube.list(kinds.GPU_NODE), key=lambda n: n["metadata"]["name"]):
        print(f"{gn['metadata']['name']}: {gn.get('status', {}).get('summary')}")

    say("the operator's decisions, as it logged them")
    for event in operator.events("bind.answered"):
        print(
            f"bind.answered {event['result']} node={event['node']} moved={event['moved']} in {event['duration_ms']} ms"
        )
    for event in operator.events("vmi.admitted") + operator.events("vmi.refused"):
        outcome = event.get("node") or event.get("reason")
        print(f"{event['event']} vmi={event['vmi']} {outcome} in {event['duration_ms']} ms")
    for event in operator.events("vmi.evacuated"):
        print(f"vmi.evacuated vmi={event['vmi']} node={event['node']} to={event['to']}")


def scraping(operator: OperatorProcess, kube: Kube) -> prometheus.Prometheus | None:
    """With DEMO_KEEP=1: a Prometheus scraping the operator with a metrics-reader token, the chart's alerts loaded."""
    if prometheus.binary() is None:
        print("no prometheus here (Debian's prometheus package): the demo keeps no Prometheus", flush=True)
        return None
    server = prometheus.Prometheus(HERE / "prometheus", [operator.port], identity.metrics_token(kube), "5s").start()
    print(f"Prometheus {server.url} scrapes the operator's /metrics every 5s with a metrics-reader token", flush=True)
    return server


def keep(kubeconfig: Path, log: Path, server: prometheus.Prometheus | None) -> None:
    say("kept running until Ctrl-C: look around with any kubectl")
    print(f"kubectl --kubeconfig {kubeconfig} get gpudevices,gpunodes -A")
    if server is not None:
        print(
            f"Prometheus: {server.url} (the chart's alerts at {server.url}/alerts; the dashboard's queries are in "
            "charts/cozy-gpu-operator/files/dashboards/cozy-gpu-operator.json)"
        )
    print(f"tail -f {log}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        signal.pause()


def second_look() -> None:
    rel = HERE.relative_to(Path.cwd()) if HERE.is_relative_to(Path.cwd()) else HERE
    print(
        f"for a second look: the operator's log {rel}/operator.log (JSON lines), the control plane's logs "
        f"{rel}/control-plane/*.log, its kubeconfig {rel}/kubeconfig (stopped now; `make demo DEMO_KEEP=1` keeps "
        "it running until Ctrl-C)"
    )


if __name__ == "__main__":
    sys.exit(main())
