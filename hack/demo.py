"""`make demo`: a local control plane with fake GPU nodes and a walk through the API.

Starts etcd and kube-apiserver (with our CRDs and KubeVirt's), creates two fake GPU
nodes, a GPUClass, a held GPUDevice and a VMI that references it, prints what the
cluster holds, and stops everything. Later steps of the operator (binder, webhook)
join this demo as they land.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from cozygpu.api import GPUDevice
from cozygpu.api.names import ANNOTATION_DEVICES, API_VERSION, LABEL_DEVICE_REFERENCE
from cozygpu.devcluster import nodes
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube import kinds

A10 = "nvidia.com/GA102GL_A10"


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def main() -> int:
    say("starting etcd and kube-apiserver on loopback")
    with ControlPlane() as plane:
        kubeconfig = plane.write_kubeconfig(Path(".dev/demo-kubeconfig").resolve())
        kube = plane.kube()
        print(f"API server {plane.server}; kubeconfig {kubeconfig}")

        say("two fake GPU nodes, GPUs in status.allocatable")
        for name, count in (("gpu-a", 4), ("gpu-b", 2)):
            nodes.create_gpu_node(kube, name, {A10: count}, labels={"gpu": "a10"})
            print(f"node {name}: {count} x {A10}")

        say("a GPUClass and a tenant's held GPUDevice")
        kube.create(
            kinds.GPU_CLASS,
            {
                "apiVersion": API_VERSION,
                "kind": "GPUClass",
                "metadata": {"name": "a10"},
                "spec": {"mode": "passthrough", "resourceName": A10, "nodeSelector": {"gpu": "a10"}},
            },
        )
        kube.create(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tenant-demo"}})
        kube.create(
            kinds.GPU_DEVICE,
            {
                "apiVersion": API_VERSION,
                "kind": "GPUDevice",
                "metadata": {"name": "train", "namespace": "tenant-demo"},
                "spec": {"className": "a10", "count": 2},
            },
        )
        device = GPUDevice.from_wire(kube.get(kinds.GPU_DEVICE, "train", "tenant-demo"))
        print(f"GPUDevice tenant-demo/{device.name}: {device.spec.count} x {device.spec.class_name}")

        say("the API server enforces the schema: count 0 is refused")
        try:
            kube.create(
                kinds.GPU_DEVICE,
                {
                    "apiVersion": API_VERSION,
                    "kind": "GPUDevice",
                    "metadata": {"name": "none", "namespace": "tenant-demo"},
                    "spec": {"className": "a10", "count": 0},
                },
            )
        except Exception as e:
            print(f"refused: {e}")

        say("a VMI that names the device, in KubeVirt's real schema")
        kube.create(
            kinds.VMI,
            {
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachineInstance",
                "metadata": {
                    "name": "trainer",
                    "namespace": "tenant-demo",
                    "labels": {LABEL_DEVICE_REFERENCE: "true"},
                    "annotations": {ANNOTATION_DEVICES: json.dumps([{"device": "train"}])},
                },
                "spec": {"domain": {"devices": {}, "resources": {"requests": {"memory": "1Gi"}}}},
            },
        )
        vmi = kube.get(kinds.VMI, "trainer", "tenant-demo")
        print(f"VMI tenant-demo/trainer annotations: {vmi['metadata']['annotations']}")
        say("stopping the control plane")
    print("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
