"""§10 with KubeVirt in the loop (issue 21 item 5): a VM started while the Lease holder is killed runs once the
successor takes the Lease, not after KubeVirt's retries have backed off.

Two replicas in cluster mode behind a balancer (tests.support.replicas), on a KubeVirt control plane of this
module's own: the tier's session operator registers configurations of the same names (--dev).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cozygpu.api import kinds
from cozygpu.devcluster import identity
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import Kube
from tests.support import vms
from tests.support.bodies import gpu_class_body, gpu_device_body
from tests.support.kubevirt import Nodes, kubevirt_plane
from tests.support.nodes import fresh_gpu
from tests.support.replicas import Replicas
from tests.support.vms import bound

pytestmark = pytest.mark.kubevirt

LEASE = 15.0  # the chart's term (settings.lease_duration's default)


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    yield from kubevirt_plane()


@pytest.fixture
def replicas(plane: ControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Replicas]:
    """Two replicas' worth of room, none started; the Lease term the chart's."""
    monkeypatch.setenv("COZYGPU_WEBHOOK_HOST", "127.0.0.1")  # the children inherit it
    kubeconfig = identity.write_kubeconfig(plane, tmp_path / "kubeconfig")
    group = Replicas(
        kubeconfig, tmp_path, "cozy-gpu-failover", plane.webhook_ca.cert_pem, extra=("--lease-duration", str(LEASE))
    )
    yield group
    group.close(plane.kube())


def _started(kube: Kube, namespace: str, name: str, refs: list[dict[str, object]]) -> float:
    """Create the VM; seconds until its VMI runs."""
    began = time.monotonic()
    kube.create(kinds.VM, vms.vm_body(name, namespace, refs))
    vms.running(kube, namespace, name, timeout=LEASE * 4)
    return time.monotonic() - began


def test_a_vm_started_during_a_leader_kill_runs_once_the_successor_leads(
    plane: ControlPlane, replicas: Replicas
) -> None:
    """kill -9 of the Lease holder, then a VM with a template GPU: the standby admits it and waits for an answer,
    the successor takes the Lease after one term and binds it, and the VM runs within the term plus the standby's
    poll (a third of it) plus what a start takes with a leader, measured here first; on the node of its set."""
    kube = plane.kube()
    gpu = fresh_gpu()
    kube.create(kinds.GPU_CLASS, gpu_class_body(gpu.cls, gpu.resource))
    namespace = f"failover-{gpu.cls}"
    kube.create(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    for _ in range(2):
        replicas.start()
    leader = replicas.leader(kube)
    nodes = Nodes(kube, gpu)
    for _ in range(2):
        nodes.add(4)
    replicas.serving(kube, namespace, gpu.cls)

    usual = _started(kube, namespace, "before", [vms.template(gpu.cls)])
    replicas.kill(leader)
    killed = time.monotonic()
    kube.create(kinds.VM, vms.vm_body("during", namespace, [vms.template(gpu.cls)]))
    vmi, pod = vms.running(kube, namespace, "during", timeout=LEASE * 4)
    took = time.monotonic() - killed

    successor = replicas.leader(kube)
    assert successor is not leader
    assert [g["deviceName"] for g in vmi["spec"]["domain"]["devices"]["gpus"]] == [gpu.resource]
    assert pod["spec"]["nodeName"] == bound(kube, namespace, "during-gpu-0") == vmi["status"]["nodeName"]
    before = vms.vmi(kube, namespace, "before") or {}
    assert bound(kube, namespace, "before-gpu-0") == before["status"]["nodeName"]  # the failover moved nothing
    limit = LEASE * 4 / 3 + usual
    assert took <= limit, (
        f"running {took:.1f} s after the kill; a term and a poll ({LEASE * 4 / 3:.0f} s) plus a"
        f" start with a leader ({usual:.1f} s) is {limit:.1f} s"
    )
    print(f"failover with KubeVirt: running {took:.1f} s after the kill (term {LEASE:.0f} s, a start {usual:.1f} s)")


def test_a_drain_whose_leader_is_killed_mid_evacuation_completes_under_the_successor(
    plane: ControlPlane, replicas: Replicas
) -> None:
    """§6.8, §10: kill -9 of the Lease holder right after KubeVirt marked the VMI for evacuation. The successor,
    deciding from its own view (the set reserved on the devices or not yet), takes the evacuation where it stood:
    the drain completes and the VM runs on the other node with the same GPUDevices."""
    kube = plane.kube()
    gpu = fresh_gpu()
    kube.create(kinds.GPU_CLASS, gpu_class_body(gpu.cls, gpu.resource))
    namespace = f"drain-{gpu.cls}"
    kube.create(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    for _ in range(2):
        replicas.start()
    leader = replicas.leader(kube)
    nodes = Nodes(kube, gpu)
    home = nodes.add(2)
    replicas.serving(kube, namespace, gpu.cls)
    kube.create(kinds.GPU_DEVICE, gpu_device_body("keep", namespace, gpu.cls))
    assert bound(kube, namespace, "keep") == home
    kube.create(kinds.VM, vms.vm_body("vm", namespace, [vms.held("keep"), vms.template(gpu.cls)], eviction="External"))
    vmi, pod = vms.running(kube, namespace, "vm", timeout=LEASE * 4)
    uids = {n: kube.get(kinds.GPU_DEVICE, n, namespace)["metadata"]["uid"] for n in ("keep", "vm-gpu-1")}
    away = nodes.add(2)

    kube.patch(kinds.NODE, home, {"spec": {"unschedulable": True}})
    assert "evacuation" in kube.evict(pod["metadata"]["name"], namespace)
    replicas.kill(leader)
    vms.drain(kube, home, timeout=LEASE * 8)
    _, pod = vms.running(kube, namespace, "vm", timeout=LEASE * 4, not_uid=vmi["metadata"]["uid"])
    assert replicas.leader(kube) is not leader
    assert pod["spec"]["nodeName"] == away
    assert {n: kube.get(kinds.GPU_DEVICE, n, namespace)["metadata"]["uid"] for n in uids} == uids
    assert bound(kube, namespace, "keep") == bound(kube, namespace, "vm-gpu-1") == away
