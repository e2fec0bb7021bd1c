"""Benchmark (§10, issue 21 item 6): admissions failed while every replica is replaced in turn (target 0).

On a local control plane: replicas of the operator in the chart's webhook mode behind a round-robin
TCP balancer on the loopback (tests/support/replicas.py, as tests/integration/test_replicas.py runs
them), four clients creating one-GPU VMIs without pause. `--rounds` rolling upgrades of `--replicas`
replicas (a new one started, an old one SIGTERMed, as a Deployment's RollingUpdate with
maxUnavailable 0 does); then `--kills` times a replica killed with SIGKILL (the leader and a standby
in turn) and a new one started, as a node failing and the Deployment replacing the pod; then the same
stream for as long as the rolling upgrades took with no replica replaced (the peer). Prints creates
and failed admissions of each beside the others, and the failures per kill: the creates in flight on
a killed replica's connections fail closed (issue 33 item 4). Asserts nothing.
Run: `make bench` (or `python bench/rolling.py --rounds 1`); loopback only.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' harness (tests/support)

from tests.support.bodies import gpu_class_body
from tests.support.replicas import Replicas

from cozygpu.api import kinds
from cozygpu.devcluster import identity, nodes
from cozygpu.devcluster.bodies import vmi_body
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import ApiError, Kube

RESOURCE = "example.com/gpu"
CLIENTS = 4


def stream(kube: Kube, namespace: str, prefix: str, stop: threading.Event) -> tuple[int, list[str]]:
    """Creates from CLIENTS threads until `stop`: (creates, failures with their messages)."""
    made, failed, lock = [0], [], threading.Lock()
    refs = [{"deviceTemplate": {"className": "gpu", "count": 1}}]

    def client(who: int) -> None:
        i = 0
        while not stop.is_set():
            name = f"{prefix}-{who}-{i}"
            i += 1
            try:
                kube.create(kinds.VMI, vmi_body(name, namespace, refs))
            except ApiError as e:
                with lock:
                    failed.append(f"{name}: {e.message}")
            with lock:
                made[0] += 1

    threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return made[0], failed


def during(kube: Kube, prefix: str, work: Callable[[], None]) -> tuple[int, list[str]]:
    """The stream of creates while `work` runs: (creates, failures)."""
    stop = threading.Event()
    out: list[tuple[int, list[str]]] = []
    streaming = threading.Thread(target=lambda: out.append(stream(kube, "rolling", prefix, stop)))
    streaming.start()
    try:
        work()
    finally:
        stop.set()
        streaming.join()
    return out[0]


def roll(group: Replicas, kube: Kube, rounds: int) -> None:
    """Rolling upgrades: a new replica started, then an old one SIGTERMed, each in turn."""
    for _ in range(rounds):
        for old in list(group.live):
            group.start()
            group.stop(old)
    group.leader(kube)


def kill(group: Replicas, kube: Kube, kills: int) -> None:
    """The leader and a standby in turn killed with SIGKILL, and a new replica started in its place."""
    for k in range(kills):
        time.sleep(2)  # the stream on every replica's connections
        leader = group.leader(kube)
        victim = leader if k % 2 == 0 else next(r for r in group.live if r is not leader)
        group.kill(victim)
        group.balancer.remove(victim.webhook_port)  # as the Service drops a pod whose node failed
        group.start()
        group.leader(kube)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--kills", type=int, default=4)
    args = p.parse_args()
    os.environ["COZYGPU_WEBHOOK_HOST"] = "127.0.0.1"  # the replicas listen on the loopback (tests/support/replicas)
    with ControlPlane() as plane, tempfile.TemporaryDirectory() as tmp:
        kube = plane.kube()
        config = identity.write_kubeconfig(plane, Path(tmp) / "operator-kubeconfig")
        kube.create(kinds.GPU_CLASS, gpu_class_body("gpu", RESOURCE))
        kube.create(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "rolling"}})
        for n in range(40):
            nodes.create_gpu_node(kube, f"node-{n}", {RESOURCE: 128})
        group = Replicas(config, Path(tmp), "bench-rolling", plane.webhook_ca.cert_pem)
        try:
            for _ in range(args.replicas):
                group.start()
            group.leader(kube)
            group.register(kube)
            time.sleep(2)  # the API server's webhook client picks the configurations up
            started = time.monotonic()
            made, failed = during(kube, "roll", lambda: roll(group, kube, args.rounds))
            seconds = time.monotonic() - started
            kill_made, kill_failed = during(kube, "kill", lambda: kill(group, kube, args.kills))
            peer_made, peer_failed = during(kube, "calm", lambda: time.sleep(seconds))
        finally:
            group.close(kube)
    print(f"{str(CLIENTS) + ' clients':<44}{'rolling':>10}{'kill -9':>10}{'neither':>10}")
    print(f"{'VMI creates':<44}{made:>10}{kill_made:>10}{peer_made:>10}")
    print(f"{'failed admissions (rolling: target 0)':<44}{len(failed):>10}{len(kill_failed):>10}{len(peer_failed):>10}")
    print(
        f"  replicas replaced: {args.rounds * args.replicas} rolling ({seconds:.0f} s), {args.kills} killed; "
        f"failed per kill: {len(kill_failed) / max(args.kills, 1):.1f}"
    )
    for line in (failed + kill_failed + peer_failed)[:5]:
        print(f"  {line}")


if __name__ == "__main__":
    main()
