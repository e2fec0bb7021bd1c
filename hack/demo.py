"""`make demo`: a local control plane with fake GPU nodes, the operator, and a short story.

Starts etcd and kube-apiserver (with our CRDs and KubeVirt's), two fake GPU nodes and
`cozygpu run`; a tenant creates held devices and the binder places them; a bind
request (written as the VMI webhook writes it) gathers a set onto one node; the
GPUNodes show what each node holds. Everything stops at the end.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from cozygpu.api.names import API_VERSION
from cozygpu.devcluster import nodes
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.devcluster.harness import OperatorProcess, answer_of, template_device, wait_for, write_request
from cozygpu.kube import kinds
from cozygpu.kube.adapter import Invalid, Kube

A10 = "nvidia.com/GA102GL_A10"
NS = "tenant-demo"


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def device(name: str, count: int) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "GPUDevice",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"className": "a10", "count": count},
    }


def show_devices(kube: Kube) -> None:
    print(f"{'DEVICE':<12}{'COUNT':<7}{'PHASE':<9}{'NODE':<8}MESSAGE")
    for d in sorted(kube.list(kinds.GPU_DEVICE, NS), key=lambda d: d["metadata"]["name"]):
        s = d.get("status", {})
        print(f"{d['metadata']['name']:<12}{d['spec']['count']:<7}{s.get('phase', ''):<9}"
              f"{s.get('nodeName', ''):<8}{s.get('message', '')}")  # fmt: skip


def bound(kube: Kube, name: str) -> bool:
    return kube.get(kinds.GPU_DEVICE, name, NS).get("status", {}).get("phase") == "Bound"


def main() -> int:
    say("starting etcd and kube-apiserver on loopback")
    with ControlPlane() as plane, tempfile.TemporaryDirectory() as tmp:
        kubeconfig = plane.write_kubeconfig(Path(".dev/demo-kubeconfig").resolve())
        kube = plane.kube()
        print(f"API server {plane.server}; kubeconfig {kubeconfig}")

        say("two fake GPU nodes with GPUs in status.allocatable, and a GPUClass")
        for name, count in (("gpu-a", 2), ("gpu-b", 4)):
            nodes.create_gpu_node(kube, name, {A10: count}, labels={"gpu": "a10"})
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

        say("starting the operator (cozygpu run)")
        operator = OperatorProcess(plane.kubeconfig_path, Path(tmp) / "operator.log", "--no-webhooks").start()
        try:
            print(f"ready: http://127.0.0.1:{operator.port}/readyz")

            say("the tenant holds GPUs: two devices of 1 unit, one of 5 (more than any node has)")
            for name, count in (("train-a", 1), ("train-b", 1), ("huge", 5)):
                kube.create(kinds.GPU_DEVICE, device(name, count))
            wait_for("devices placed", lambda: bound(kube, "train-a") and bound(kube, "train-b"))
            wait_for("huge pending", lambda: kube.get(kinds.GPU_DEVICE, "huge", NS).get("status", {}).get("phase"))
            show_devices(kube)

            say("the API server refuses a device of 0 units")
            try:
                kube.create(kinds.GPU_DEVICE, device("none", 0))
            except Invalid as e:
                print(f"refused: {e}")

            say("a VMI asks for train-a, train-b and a template GPU together: the set is gathered on one node")
            template_device(kube, NS, "vm-gpu-2", "a10")
            names = ["train-a", "train-b", "vm-gpu-2"]
            request_id = write_request(kube, NS, names, "vm")
            answered = answer_of(kube, NS, names, request_id)
            result = answered[0]["status"]["bindRequest"]
            print(f"bind request {request_id}: {result['result']} {result.get('message', '')}")
            show_devices(kube)
            kube.delete(kinds.GPU_DEVICE, "vm-gpu-2", NS)

            say("GPUNodes: what each node holds")
            wait_for("accounting", lambda: len(kube.list(kinds.GPU_NODE)) == 2)
            for gn in sorted(kube.list(kinds.GPU_NODE), key=lambda n: n["metadata"]["name"]):
                print(f"{gn['metadata']['name']}: {gn.get('status', {}).get('summary')}")

            say("the operator's decisions, as it logged them")
            for event in operator.events("bind.answered"):
                print(f"bind.answered {event['result']} node={event['node']} moved={event['moved']} "
                      f"in {event['duration_ms']} ms")  # fmt: skip
        finally:
            operator.stop()
        say("stopping the operator and the control plane")
    print("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
