"""§10 metrics: what a scrape shows is what the view holds, and latencies land in their histograms."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from cozygpu.api import kinds
from cozygpu.runtime.metrics import Metrics
from cozygpu.runtime.view import View
from cozygpu.state.cluster import Cluster
from tests.support.views import A10, EPOCH, L40S, budget, cluster, device, gpu_class, node, request


def scrape(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of one scrape, keyed by name and sorted labels."""
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def view() -> Cluster:
    c = cluster(
        nodes=[node("n1", {A10: 4})],
        classes=[gpu_class("a10")],
        devices=[
            device("bound", count=2, phase="Bound", node_name="n1"),
            device("waiting", phase="Pending"),
            device("new"),
            device("asked", status=request("r1", "vm", ["asked"], EPOCH)),
        ],
    )
    View(c).apply(
        kinds.GPU_NODE,
        {
            "metadata": {"name": "n1", "resourceVersion": "1"},
            "status": {
                "resources": [{"name": A10, "allocatable": 4, "held": 2, "free": 2}],
                "conditions": [{"type": "LostCapacity", "status": "False"}],
            },
        },
    )
    held = budget("cap", limits={"a10": 3}, total=5)
    held["status"] = {"used": {"a10": 4}, "usedTotal": 4, "conditions": [{"type": "OverBudget", "status": "True"}]}
    View(c).apply(kinds.GPU_BUDGET, held)
    return c


def test_devices_are_counted_by_class_and_phase() -> None:
    """Bound, Pending and not yet decided (Unseen) devices per class; open requests counted apart."""
    samples = scrape(Metrics(view()))
    assert samples[("cozygpu_devices", (("class", "a10"), ("phase", "Bound")))] == 1
    assert samples[("cozygpu_devices", (("class", "a10"), ("phase", "Pending")))] == 1
    assert samples[("cozygpu_devices", (("class", "a10"), ("phase", "Unseen")))] == 2
    assert samples[("cozygpu_bind_requests_open", ())] == 1


def test_node_units_and_lost_capacity_follow_the_gpunode() -> None:
    """allocatable, held, unmanaged and free per node and resource, and the LostCapacity condition as 0/1."""
    samples = scrape(Metrics(view()))
    for state, value in (("allocatable", 4), ("held", 2), ("unmanaged", 0), ("free", 2)):
        assert samples[("cozygpu_node_units", (("node", "n1"), ("resource", A10), ("state", state)))] == value
    assert samples[("cozygpu_node_lost_capacity", (("node", "n1"),))] == 0


def test_budget_use_limits_and_over_budget() -> None:
    """Used against limit per class and in total; OverBudget as 1."""
    samples = scrape(Metrics(view()))
    key = (("budget", "cap"), ("class", "a10"), ("namespace", "t1"))
    assert (samples[("cozygpu_budget_used_units", key)], samples[("cozygpu_budget_limit_units", key)]) == (4, 3)
    total = (("budget", "cap"), ("namespace", "t1"))
    assert samples[("cozygpu_budget_used_total_units", total)] == 4
    assert samples[("cozygpu_budget_limit_total_units", total)] == 5
    assert samples[("cozygpu_budget_over", total)] == 1


def test_latencies_are_observed_by_webhook_and_result() -> None:
    """Each observation counts once under its own labels; registries are per Metrics, never shared."""
    metrics = Metrics(Cluster())
    metrics.admission.labels("vmi", "denied").observe(0.02)
    metrics.bind.labels("Succeeded").observe(0.3)
    samples = scrape(metrics)
    assert samples[("cozygpu_admission_duration_seconds_count", (("result", "denied"), ("webhook", "vmi")))] == 1
    assert samples[("cozygpu_bind_duration_seconds_count", (("result", "Succeeded"),))] == 1
    assert ("cozygpu_admission_duration_seconds_count", (("result", "denied"), ("webhook", "vmi"))) not in scrape(
        Metrics(Cluster())
    )


def placed_false(since: dt.datetime, reason: str = "Unschedulable") -> dict[str, Any]:
    """A status's Placed condition as the binder writes it for a device that waits (decisions.transitions)."""
    return {
        "conditions": [
            {
                "type": "Placed",
                "status": "False",
                "reason": reason,
                "message": "waiting",
                "lastTransitionTime": since.isoformat(),
            }
        ]
    }


def waited(metrics: Metrics) -> dict[tuple[tuple[str, str], ...], float]:
    """The longest-wait gauge's samples, by sorted labels."""
    name = "cozygpu_devices_waiting_since_timestamp_seconds"
    return {labels: v for (n, labels), v in scrape(metrics).items() if n == name}


def test_the_longest_wait_per_class_and_phase_follows_the_devices_as_they_change() -> None:
    """Per class and phase, the earliest Placed=False among Pending/Lost devices; the next in line once it goes."""
    # Bound, undecided and deleting devices do not wait.
    at = [EPOCH + dt.timedelta(minutes=m) for m in range(6)]
    c = cluster(
        classes=[gpu_class("a10"), gpu_class("l40", L40S)],
        devices=[
            device("second", phase="Pending", status=placed_false(at[2])),
            device("first", phase="Pending", status=placed_false(at[1])),
            device("gone-node", phase="Lost", node_name="n9", status=placed_false(at[0], "NodeLost")),
            device("other", "l40", phase="Pending", status=placed_false(at[3])),
            device("undecided"),
            device("held", phase="Bound", node_name="n1"),
        ],
    )
    metrics = Metrics(c)
    a10, l40 = (("class", "a10"), ("phase", "Pending")), (("class", "l40"), ("phase", "Pending"))
    lost = (("class", "a10"), ("phase", "Lost"))
    assert waited(metrics) == {a10: at[1].timestamp(), lost: at[0].timestamp(), l40: at[3].timestamp()}

    View(c).apply(kinds.GPU_DEVICE, device("first", phase="Bound", node_name="n1"))
    deleting = device("other", "l40", phase="Pending", status=placed_false(at[3]))
    deleting["metadata"] |= {"deletionTimestamp": at[5].isoformat(), "finalizers": ["x"]}
    View(c).apply(kinds.GPU_DEVICE, deleting)
    View(c).forget(kinds.GPU_DEVICE, "t1", "gone-node")
    assert waited(metrics) == {a10: at[2].timestamp()}


def test_readiness_and_leadership_are_read_from_the_process_at_scrape_time() -> None:
    """0 until the process points them at its state; then whatever that state is when scraped."""
    metrics = Metrics(Cluster())
    assert scrape(metrics)[("cozygpu_ready", ())] == scrape(metrics)[("cozygpu_leader", ())] == 0
    state = {"ready": True, "leading": False}
    metrics.ready.set_function(lambda: float(state["ready"]))
    metrics.leader.set_function(lambda: float(state["leading"]))
    assert (scrape(metrics)[("cozygpu_ready", ())], scrape(metrics)[("cozygpu_leader", ())]) == (1, 0)
    state["leading"] = True
    assert scrape(metrics)[("cozygpu_leader", ())] == 1


def test_the_served_scrape_written_off_the_loop_says_what_one_written_at_once_says() -> None:
    """/metrics reads the figures on the event loop and writes the text in a thread: the same text."""
    metrics = Metrics(view())
    off_loop, content_type = asyncio.run(metrics.render_off_loop())
    at_once, _ = metrics.render()
    assert content_type.startswith("text/plain")
    assert off_loop == at_once and b'cozygpu_devices{class="a10",phase="Bound"} 1.0' in at_once


def test_devices_by_phase_are_counted_as_they_change_and_equal_a_recount() -> None:
    """The devices-by-phase gauge comes from counts the view keeps, never a walk over every device at scrape time:
    after devices appear, change phase, move and go, the counts equal a recount."""
    c = view()
    v = View(c)
    v.apply(kinds.GPU_DEVICE, device("waiting", phase="Bound", node_name="n1"))
    v.apply(kinds.GPU_DEVICE, device("new", phase="Pending"))
    v.apply(kinds.GPU_DEVICE, device("bound", count=2, phase="Bound", node_name="n1"), deleted=True)
    v.apply(kinds.GPU_DEVICE, device("more", "a10", phase="Lost", node_name="gone"))
    recount: dict[tuple[str, Any], int] = {}
    for d in c.devices.values():
        recount[(d.spec.class_name, d.status.phase)] = recount.get((d.spec.class_name, d.status.phase), 0) + 1
    assert c.devices.by_phase() == recount
    assert scrape(Metrics(c))[("cozygpu_devices", (("class", "a10"), ("phase", "Bound")))] == 1
