"""§10 with replicas behind one address (issue 21 item 5): every synced replica answers admissions, the Lease
holder alone binds; a leader killed, a rolling upgrade and a budget raced over replicas break nothing.

The replicas run in cluster mode behind a round-robin TCP balancer (tests.support.replicas), as a Service
spreads the API server's webhook calls over a Deployment; the test registers the configurations at it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cozygpu.api import kinds
from cozygpu.api.names import ANNOTATION_DEVICES, LABEL_TEMPLATE_DEVICE, gpu_entry_name, template_device_name
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import ApiError, Kube
from tests.support.bodies import budget_body, gpu_device_body, unique, vmi_body
from tests.support.harness import OperatorProcess, wait_for
from tests.support.invariants import admitting, violations
from tests.support.nodes import Gpu, GPUNodeFactory
from tests.support.replicas import Replicas

pytestmark = pytest.mark.integration

QUICK = ("--grace-period", "1", "--sweep-interval", "1", "--bind-timeout", "4")  # test_kill_during_bursts's


@pytest.fixture
def replicas(
    control_plane: ControlPlane, operator_kubeconfig: Path, kube: Kube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Replicas]:
    """Replicas of the test's own Lease behind a balancer, none started yet; all stopped and unregistered after.

    With the default timeouts: a grace period shorter than an admission's wait would let a new leader's collector
    delete the device of an admission under way (a test's setting, not a fault)."""
    monkeypatch.setenv("COZYGPU_WEBHOOK_HOST", "127.0.0.1")  # the children inherit it
    group = Replicas(operator_kubeconfig, tmp_path, unique("lease"), control_plane.webhook_ca.cert_pem)
    yield group
    group.close(kube)


def _template(cls: str, count: int = 1) -> list[dict[str, Any]]:
    return [{"deviceTemplate": {"className": cls, "count": count}}]


def _gpus(vmi: dict[str, Any]) -> list[str]:
    return [g["name"] for g in (vmi.get("spec") or {}).get("domain", {}).get("devices", {}).get("gpus") or []]


def _admitted(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if not e.get("dry_run")]


def _phase_of(device: dict[str, Any]) -> str | None:
    phase: str | None = (device.get("status") or {}).get("phase")
    return phase


def _phase(kube: Kube, namespace: str, name: str) -> str | None:
    return _phase_of(kube.get_or_none(kinds.GPU_DEVICE, name, namespace) or {})


def _all_bound(kube: Kube, namespace: str, devices: list[str], timeout: float = 30) -> None:
    def unbound() -> list[str]:
        return [d for d in devices if _phase(kube, namespace, d) != "Bound"]

    with contextlib.suppress(AssertionError):
        wait_for("every admitted set Bound", lambda: not unbound(), timeout=timeout)
    assert unbound() == []


def _invariants_hold(kube: Kube, namespace: str, operator: OperatorProcess) -> None:
    """The reliability tier's invariants (tests.support.invariants), once the replicas have caught up."""

    def now() -> list[str]:
        try:
            return violations(kube, namespace, operator)
        except ApiError as e:
            return [f"the checker could not read: {e.message}"]

    with contextlib.suppress(AssertionError):
        wait_for("every invariant to hold", lambda: not now(), timeout=30)
    assert now() == []


def test_a_standby_answers_admissions_while_the_leader_binds(
    kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory, replicas: Replicas
) -> None:
    """VMIs created through the balancer are admitted by every replica with their GPU entries; only the leader binds."""
    for n in range(2):
        gpu_node({gpu.resource: 32}, name=f"ha-{n}-{gpu.cls}")
    for _ in range(3):
        replicas.start()
    leader = replicas.leader(kube)
    replicas.serving(kube, namespace, gpu.cls)

    created: list[str] = []
    failed: list[str] = []
    numbers = itertools.count()

    def create(name: str) -> None:
        try:
            kube.create(kinds.VMI, vmi_body(name, namespace, _template(gpu.cls)))
        except ApiError as e:
            failed.append(f"{name}: {e.message}")
            return
        created.append(name)

    def served_by_every_replica() -> bool:
        wave = [f"vm{next(numbers)}" for _ in range(6)]  # at once: the API server opens several connections
        threads = [threading.Thread(target=create, args=(name,)) for name in wave]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return all(_admitted(r.process.events("vmi.admitted")) for r in replicas.live)

    wait_for("every replica to admit some VMI", served_by_every_replica, timeout=60)
    assert failed == []
    for name in created:
        assert _gpus(kube.get(kinds.VMI, name, namespace)) == [gpu_entry_name(0, 0)], name
    _all_bound(kube, namespace, [template_device_name(name, 0) for name in created])
    answered = sum(len(_admitted(r.process.events("vmi.admitted"))) for r in replicas.live)
    assert answered == len(created)
    assert leader.process.events("bind.answered")
    assert [r.identity for r in replicas.live if r.process.events("bind.answered")] == [leader.identity]


def test_a_replica_that_joins_admits_once_the_kept_connections_have_lived_their_life(
    kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory, replicas: Replicas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """§10: the API server keeps its connections to a webhook and reuses them; each lives
    COZYGPU_WEBHOOK_CONNECTION_LIFE (4 s here, 30 s by default), so a replica that joins beside a serving one admits
    VMIs soon. Before, with one admission at a time, the joiner admitted none while the first replica ran."""
    monkeypatch.setenv("COZYGPU_WEBHOOK_CONNECTION_LIFE", "4")
    gpu_node({gpu.resource: 8}, name=f"join-{gpu.cls}")
    first = replicas.start()
    replicas.serving(kube, namespace, gpu.cls)
    joined = replicas.start()
    refs = _template(gpu.cls)

    def admitted_by_both() -> bool:
        kube.create(kinds.VMI, vmi_body(unique("probe"), namespace, refs), dry_run=True)  # one at a time
        return bool(joined.process.events("vmi.admitted")) and bool(first.process.events("vmi.admitted"))

    wait_for("the replica that joined to admit a VMI", admitted_by_both, timeout=30)


def test_kill_9_of_the_leader_during_a_burst_leaves_nothing_broken(
    kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory, replicas: Replicas
) -> None:
    """The leader killed (SIGKILL) in a burst of creates: no over-allocation, no leak, every admitted set Bound,
    every refusal with a reason; the successor admits and binds afterwards."""
    rng = random.Random()
    for n in range(2):
        gpu_node({gpu.resource: 4}, name=f"kill-{n}-{gpu.cls}")
    held = [f"held-{i}" for i in range(3)]
    for name in held:
        kube.create(kinds.GPU_DEVICE, gpu_device_body(name, namespace, gpu.cls))
    kube.create(kinds.GPU_BUDGET, budget_body(namespace, limits={gpu.cls: 6}))  # the budget refuses some orders
    replicas.extra = QUICK  # as test_kill_during_bursts: the invariants hold once a grace period and a sweep passed
    for _ in range(3):
        replicas.start()
    leader = replicas.leader(kube)
    replicas.serving(kube, namespace, gpu.cls)

    outcomes: dict[str, dict[str, Any] | str] = {}

    def create(name: str, refs: list[dict[str, Any]]) -> None:
        try:
            outcomes[name] = kube.create(kinds.VMI, vmi_body(name, namespace, refs))
        except ApiError as e:
            outcomes[name] = e.message

    def refs() -> list[dict[str, Any]]:
        chosen: list[dict[str, Any]] = [{"device": d} for d in rng.sample(held, rng.randint(0, 2))]
        return chosen + _template(gpu.cls, rng.randint(1, 2)) * rng.randint(0 if chosen else 1, 2)

    threads = [threading.Thread(target=create, args=(f"vm{i}", refs())) for i in range(12)]
    for t in threads:
        t.start()
    admitting(kube, namespace, "vm")
    time.sleep(rng.uniform(0.0, 0.3))
    replicas.kill(leader)
    for t in threads:
        t.join(timeout=60)
    successor = replicas.leader(kube)
    assert successor is not leader

    _invariants_hold(kube, namespace, successor.process)
    admitted = {n: o for n, o in outcomes.items() if isinstance(o, dict)}
    refused = {n: o for n, o in outcomes.items() if isinstance(o, str)}
    assert len(outcomes) == len(threads)
    assert all(reason.strip() for reason in refused.values()), refused
    sets = []
    for name, body in admitted.items():
        stored = kube.get(kinds.VMI, name, namespace)
        assert _gpus(stored), f"{name} admitted without its GPU entries"
        entries = _devices_of(body)
        sets += [d if d in held else template_device_name(name, i) for i, d in enumerate(entries)]
    _all_bound(kube, namespace, sets)

    # The burst's VMIs gone, their units come back; the successor admits and binds a new one.
    for name in admitted:
        kube.delete(kinds.VMI, name, namespace)
    _invariants_hold(kube, namespace, successor.process)
    after = kube.create(kinds.VMI, vmi_body("after", namespace, _template(gpu.cls)))
    assert _gpus(after) == [gpu_entry_name(0, 0)]
    _all_bound(kube, namespace, [template_device_name("after", 0)])


def _devices_of(vmi: dict[str, Any]) -> list[str]:
    """Its references, in order: a held device's name, or "" for a template entry."""
    return [r.get("device", "") for r in json.loads(vmi["metadata"]["annotations"][ANNOTATION_DEVICES])]


def test_a_rolling_upgrade_under_a_stream_of_creates_fails_no_admission(
    kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory, replicas: Replicas
) -> None:
    """Each original replica replaced in turn (a new one started, an old one SIGTERMed) while two clients create
    VMIs: every create admitted, with its GPU entries and its set Bound."""
    for n in range(2):
        gpu_node({gpu.resource: 128}, name=f"roll-{n}-{gpu.cls}")
    originals = [replicas.start() for _ in range(2)]
    replicas.leader(kube)
    replicas.serving(kube, namespace, gpu.cls)

    created: list[str] = []
    failed: list[str] = []
    upgraded = threading.Event()

    def client(who: str) -> None:
        for i in range(120):
            name = f"{who}-{i}"
            try:
                kube.create(kinds.VMI, vmi_body(name, namespace, _template(gpu.cls)))
                created.append(name)
            except ApiError as e:
                failed.append(f"{name}: {e.message}")
            if upgraded.is_set():
                return
            time.sleep(0.05)

    clients = [threading.Thread(target=client, args=(who,)) for who in ("a", "b")]
    for t in clients:
        t.start()
    try:
        for old in originals:
            replicas.start()
            replicas.stop(old)
        replicas.leader(kube)
    finally:
        upgraded.set()
        for t in clients:
            t.join(timeout=60)
    assert failed == []
    assert len(created) >= 10
    for name in created:
        assert _gpus(kube.get(kinds.VMI, name, namespace)) == [gpu_entry_name(0, 0)], name
    _all_bound(kube, namespace, [template_device_name(name, 0) for name in created])


# Issue 21 item 3, closed (§7.4): a held order another replica admitted reaches the leader's binder through the
# budget's record of orders (issue 36; the one order ledger before it) before its device reaches the view, so a
# template bind and that create can no longer pass the budget together (before: 6 to 10 units against 4 in every
# run). The race is not run every time, so a pass alone is weak evidence;
# tests/unit/runtime/workers/binder/test_bind_orders.py decides each interleaving.
@pytest.mark.parametrize("count", [1, 3], ids=["one replica", "three replicas"])
def test_a_budget_raced_across_replicas_is_never_exceeded(
    kube: Kube, namespace: str, gpu: Gpu, gpu_node: GPUNodeFactory, replicas: Replicas, count: int
) -> None:
    """Held-device creates and VMI admissions at once, spread over the replicas: the units in use never pass the
    namespace's GPUBudget (one replica: the control)."""
    limit = 4
    for n in range(2):
        gpu_node({gpu.resource: 16}, name=f"budget-{n}-{gpu.cls}")
    kube.create(kinds.GPU_BUDGET, budget_body(namespace, limits={gpu.cls: limit}))
    for _ in range(count):
        replicas.start()
    replicas.leader(kube)
    replicas.serving(kube, namespace, gpu.cls)

    def in_use() -> tuple[int, list[str]]:
        """Units of admitted orders (§7.4), and which devices: held devices not being deleted, and template devices
        once Bound (the VMI webhook's early check is advice; the binder's check decides, and undoes the rest)."""
        live = [
            d
            for d in kube.list(kinds.GPU_DEVICE, namespace)
            if not d["metadata"].get("deletionTimestamp")
            and (d["metadata"].get("labels", {}).get(LABEL_TEMPLATE_DEVICE) != "true" or _phase_of(d) == "Bound")
        ]
        return sum(d["spec"].get("count", 1) for d in live), sorted(d["metadata"]["name"] for d in live)

    most: tuple[int, list[str]] = (0, [])
    racing = threading.Event()

    def watch() -> None:
        nonlocal most
        while racing.is_set():
            with contextlib.suppress(ApiError):
                most = max(most, in_use())

    start = threading.Barrier(25)

    def order(act: Any) -> None:
        start.wait()
        with contextlib.suppress(ApiError):  # refused: over the budget
            act()

    acts = [
        lambda i=i: kube.create(kinds.GPU_DEVICE, gpu_device_body(f"held-{i}", namespace, gpu.cls)) for i in range(12)
    ]
    acts += [lambda i=i: kube.create(kinds.VMI, vmi_body(f"vm{i}", namespace, _template(gpu.cls))) for i in range(12)]
    threads = [threading.Thread(target=order, args=(act,)) for act in acts]
    racing.set()
    watcher = threading.Thread(target=watch)
    watcher.start()
    for t in threads:
        t.start()
    start.wait()
    for t in threads:
        t.join(timeout=60)
    time.sleep(1)  # what a refused admission undoes, undone
    racing.clear()
    watcher.join()
    final = in_use()
    served = [len(r.process.events("vmi.admitted")) + len(r.process.events("vmi.refused")) for r in replicas.live]
    assert max(most, final)[0] <= limit, (
        f"{most[0]} units in use at most ({', '.join(most[1])}), {final[0]} after; budget {limit}; VMI reviews per"
        f" replica {served}"
    )
