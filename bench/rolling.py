"""Benchmark (§10, issue 21 item 6): admissions failed while every replica is replaced in turn (target 0).

On a local control plane: replicas of the operator in the chart's webhook mode behind a round-robin
TCP balancer on the loopback (tests/support/replicas.py, as tests/integration/test_replicas.py runs
them), four clients creating one-GPU VMIs without pause. `--rounds` rolling upgrades of `--replicas`
replicas (a new one started, an old one SIGTERMed, as a Deployment's RollingUpdate with
maxUnavailable 0 does); then the same stream for the same time with no replica replaced (the peer).
Prints creates and failed admissions of each beside the other. Asserts nothing.
Run: `make bench` (or `python bench/rolling.py --rounds 1`); loopback only.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
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
            stop = threading.Event()
            rolled: list[tuple[int, list[str]]] = []
            roller = threading.Thread(target=lambda: rolled.append(stream(kube, "rolling", "roll", stop)))
            roller.start()
            for _ in range(args.rounds):
                for old in list(group.live):
                    group.start()
                    group.stop(old)
            group.leader(kube)
            stop.set()
            roller.join()
            seconds = time.monotonic() - started
            calm = threading.Event()
            timer = threading.Timer(seconds, calm.set)
            timer.start()
            peer = stream(kube, "rolling", "calm", calm)
        finally:
            group.close(kube)
    (made, failed), (peer_made, peer_failed) = rolled[0], peer
    print(f"{'over ' + f'{seconds:.0f}' + ' s, ' + str(CLIENTS) + ' clients':<44}{'rolling':>10}{'no roll':>10}")
    print(f"{'VMI creates':<44}{made:>10}{peer_made:>10}")
    print(f"{'failed admissions (target 0)':<44}{len(failed):>10}{len(peer_failed):>10}")
    print(f"  replicas replaced: {args.rounds * args.replicas}")
    for line in (failed + peer_failed)[:5]:
        print(f"  {line}")


if __name__ == "__main__":
    main()
