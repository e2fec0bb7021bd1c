"""§10, one active binder: two operators, one Lease; both keep a view and are ready, only the holder decides,
and a standby takes over without a list.

Each replica is its own process with its own identity, competing for a Lease of this test's own (the
other tests' operators share the default Lease under one identity, the host's).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cozygpu.api import kinds
from cozygpu.kube.adapter import Kube
from tests.support.bodies import unique
from tests.support.harness import (
    OperatorProcess,
    answer_of,
    logged,
    template_device,
    wait_for,
    write_request,
)
from tests.support.nodes import Gpu, GPUNodeFactory
from tests.support.operators import start_operator

pytestmark = pytest.mark.integration


def test_only_the_leader_decides_and_a_standby_takes_over_when_it_dies(
    operator_kubeconfig: Path, kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory, tmp_path: Path
) -> None:
    """Replica a leads and answers; b keeps its view and is ready as a standby, deciding nothing; a is killed;
    b leads and answers, without listing again."""
    lease = unique("lease")
    common = ("--no-webhooks", "--lease-name", lease, "--lease-duration", "6")
    (tmp_path / "a").mkdir()
    a = start_operator(operator_kubeconfig, tmp_path / "a", "--identity", "replica-a", *common)
    b = OperatorProcess(operator_kubeconfig, tmp_path / "b.log", "--identity", "replica-b", *common)
    b.start(until_ready=False)
    try:
        probe = wait_for("b waits", lambda: "held by replica-a" in b.probe("/readyz")[1] and b.probe("/readyz"))
        assert probe[0] == 200 and probe[1].startswith("ok: standby")
        assert b.events("operator.synced") and not b.events("operator.deciding")
        holder = kube.get(kinds.kind("Lease"), lease, "cozy-gpu-system")["spec"]["holderIdentity"]
        assert holder == "replica-a"

        gpu_node({gpu.resource: 2}, name=f"lead-{gpu.cls}")
        template_device(kube, namespace, "vm1-gpu-0", gpu.cls)
        first = write_request(kube, namespace, ["vm1-gpu-0"], "vm1")
        answer_of(kube, namespace, ["vm1-gpu-0"], first)
        logged(a, "bind.answered", lambda e: e["request_id"] == first)
        assert [e["request_id"] for e in a.events("bind.answered")] == [first]
        assert b.events("bind.answered") == []

        a.kill()
        wait_for("b leads", lambda: b.events("operator.deciding"), timeout=30)
        assert b.events("leader.acquired") and b.probe("/readyz") == (200, "ok: leader")
        template_device(kube, namespace, "vm2-gpu-0", gpu.cls)
        second = write_request(kube, namespace, ["vm2-gpu-0"], "vm2")
        [answered] = answer_of(kube, namespace, ["vm2-gpu-0"], second)
        assert answered["status"]["bindRequest"]["result"] == "Succeeded"
        logged(b, "bind.answered", lambda e: e["request_id"] == second)
        assert [e["request_id"] for e in b.events("bind.answered")] == [second]
        assert len(b.events("operator.synced")) == 1, "the standby synced its view again on taking over"
        lease_now = kube.get(kinds.kind("Lease"), lease, "cozy-gpu-system")["spec"]
        assert (lease_now["holderIdentity"], lease_now["leaseTransitions"]) == ("replica-b", 1)
    finally:
        a.kill()
        b.stop()


def test_a_clean_stop_hands_the_lease_back(operator_kubeconfig: Path, kube: Kube, tmp_path: Path) -> None:
    """Stopped with SIGTERM, the leader releases the Lease, so a successor need not wait out the term."""
    lease = unique("lease")
    a = start_operator(
        operator_kubeconfig,
        tmp_path,
        "--no-webhooks",
        "--identity",
        "replica-a",
        "--lease-name",
        lease,
        "--lease-duration",
        "60",
    )
    # Ready as soon as its view has synced (§10), a replica may take the Lease a moment later.
    holder = wait_for(
        "a leads",
        lambda: (
            (kube.get_or_none(kinds.kind("Lease"), lease, "cozy-gpu-system") or {})
            .get("spec", {})
            .get("holderIdentity")
        ),
    )
    assert holder == "replica-a"
    a.stop()
    assert kube.get(kinds.kind("Lease"), lease, "cozy-gpu-system")["spec"].get("holderIdentity", "") == ""
    assert a.events("leader.released")
