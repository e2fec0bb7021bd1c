"""Prometheus metrics (§10): latencies observed as they happen, the rest read at scrape time.

`Metrics` owns its registry (no process-wide state). The Operator makes one, hands it to
the binder and times its admission handlers with it, and points `ready` and `leader` at its own
state; the health server serves it at `/metrics`. Gauges come from a collector over the cluster
view and the statuses the accountant keeps there, read from indexes the view keeps as it
changes, so a scrape lists nothing from the API. The chart's alerts and dashboard
(charts/cozy-gpu-operator/files) read these names.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client import Counter as Tally
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cozygpu.api import Condition, ConditionStatus
from cozygpu.api.names import CONDITION_LOST_CAPACITY, CONDITION_OVER_BUDGET
from cozygpu.state.cluster import Cluster

# Admissions answer in milliseconds unless they wait on the binder (bind timeout 10 s, webhook 20 s).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0)
UNSEEN = "Unseen"  # the phase label of a device the operator has not decided on yet


class Metrics:
    def __init__(self, cluster: Cluster) -> None:
        self.registry = CollectorRegistry()
        self.admission = Histogram(
            "cozygpu_admission_duration_seconds",
            "Time to answer an admission review, by webhook and outcome (allowed, denied, error).",
            ["webhook", "result"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.bind = Histogram(
            "cozygpu_bind_duration_seconds",
            "Time from a bind request being written to the binder's answer, by result.",
            ["result"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.decisions = Tally(
            "cozygpu_binder_decisions_total",
            "Placements the binder decided outside bind requests (§5.5), by result (Bound, Pending): a backlog"
            " that cannot be placed adds nothing until room for it appears (§14.3).",
            ["result"],
            registry=self.registry,
        )
        self.idle_moves = Tally(
            "cozygpu_idle_moves_total",
            "Idle held devices moved to make room for an order that fit on no node (§5.7), by result (Moved, Failed).",
            ["result"],
            registry=self.registry,
        )
        self.evacuations = Tally(
            "cozygpu_evacuations_total",
            "Evacuations off cordoned nodes (§6.8), by what moved (device: an idle held device; vm: a VM restarted"
            " elsewhere) and result (Moved, Restarted, Stopped, Blocked, Failed).",
            ["what", "result"],
            registry=self.registry,
        )
        self.evacuations_in_flight = Gauge(
            "cozygpu_evacuations_in_flight",
            "VM evacuations under way (§6.8): from their first write until the VMI they started with is gone.",
            registry=self.registry,
        )
        self.evacuations_blocked = Gauge(
            "cozygpu_evacuations_blocked",
            "VMs marked for evacuation off a node being drained that cannot leave it now (§6.8: no node takes their"
            " set, or no VM starts them again); each one's reason is on its node's GPUNode.",
            registry=self.registry,
        )
        self.refused_connections = Tally(
            "cozygpu_webhook_connections_refused_total",
            "Connections the webhook port turned away before or during TLS (§14.1), by reason: peer_connections"
            " (the peer address had too many open), waited_too_long (backoff and turn), handshake_failed.",
            ["reason"],
            registry=self.registry,
        )
        # The process's own state, read at scrape time once the Operator points them at it (0 until then).
        self.ready = Gauge("cozygpu_ready", "1 while /readyz answers 200 (leader or standby).", registry=self.registry)
        self.leader = Gauge(
            "cozygpu_leader",
            "1 while this replica holds the Lease and runs the binder's side (§10).",
            registry=self.registry,
        )
        self.registry.register(ViewCollector(cluster))

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type, all at once (tests, tools)."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    async def render_off_loop(self) -> tuple[bytes, str]:
        """As `render`, for /metrics: the figures are read on the event loop (only it may read the view), the text
        is written in a thread. At 5,000 nodes the text is 2 MB and most of a scrape's time, which the loop would
        otherwise spend away from admissions and the binder."""
        collected = CollectorRegistry(auto_describe=False)
        collected.register(_Collected(list(self.registry.collect())))
        return await asyncio.to_thread(generate_latest, collected), CONTENT_TYPE_LATEST


class _Collected(Collector):
    """Metric families read already, handed to the text's writer as they are."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


class ViewCollector(Collector):
    """Devices by phase, units per node and class, budget use: what the view holds at scrape time."""

    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from self._devices()
        yield from self._nodes()
        yield from self._classes()
        yield from self._budgets()

    def _devices(self) -> Iterator[GaugeMetricFamily]:
        c = self._cluster
        phases = GaugeMetricFamily(
            "cozygpu_devices", "GPUDevices by class and phase (Unseen: not decided on yet).", labels=["class", "phase"]
        )
        counts = {(cls, phase.value if phase else UNSEEN): n for (cls, phase), n in c.devices.by_phase().items()}
        for (cls, phase_name), n in sorted(counts.items()):
            phases.add_metric([cls, phase_name], n)
        yield phases
        since = GaugeMetricFamily(
            "cozygpu_devices_waiting_since_timestamp_seconds",
            "When the class's Pending (or Lost) device waiting longest began to wait, Unix seconds.",
            labels=["class", "phase"],
        )
        for (cls, phase), at in sorted(c.devices.waiting_since().items()):
            since.add_metric([cls, phase.value], at.timestamp())
        yield since
        yield GaugeMetricFamily(
            "cozygpu_bind_requests_open",
            "Bind requests some device carries without an answer.",
            value=c.devices.open_request_count(),
        )

    def _nodes(self) -> Iterator[GaugeMetricFamily]:
        units = GaugeMetricFamily(
            "cozygpu_node_units",
            "GPU units per node and resource as its GPUNode says (state: allocatable, held, unmanaged, free).",
            labels=["node", "resource", "state"],
        )
        lost = GaugeMetricFamily(
            "cozygpu_node_lost_capacity", "1 while the node's LostCapacity condition is True.", labels=["node"]
        )
        for name, gpunode in sorted(self._cluster.gpunodes.items()):
            for r in gpunode.status.resources:
                states = (
                    ("allocatable", r.allocatable),
                    ("held", r.held),
                    ("unmanaged", r.unmanaged),
                    ("free", r.free),
                )
                for state, value in states:
                    units.add_metric([name, r.name, state], value)
            lost.add_metric([name], _condition_true(gpunode.status.conditions, CONDITION_LOST_CAPACITY))
        yield units
        yield lost

    def _classes(self) -> Iterator[GaugeMetricFamily]:
        units = GaugeMetricFamily(
            "cozygpu_class_units",
            "GPU units of each class on the nodes that serve it (state: allocatable, held, free).",
            labels=["class", "state"],
        )
        for name, cls in sorted(self._cluster.classes.items()):
            for state, value in (
                ("allocatable", cls.status.allocatable),
                ("held", cls.status.held),
                ("free", cls.status.free),
            ):
                units.add_metric([name, state], value)
        yield units

    def _budgets(self) -> Iterator[GaugeMetricFamily]:
        labels = ["namespace", "budget", "class"]
        used = GaugeMetricFamily("cozygpu_budget_used_units", "Units counting against a budget.", labels=labels)
        limit = GaugeMetricFamily("cozygpu_budget_limit_units", "A budget's limit per class.", labels=labels)
        used_total = GaugeMetricFamily(
            "cozygpu_budget_used_total_units",
            "Units counting against a budget over all classes.",
            labels=["namespace", "budget"],
        )
        limit_total = GaugeMetricFamily(
            "cozygpu_budget_limit_total_units", "A budget's total, where it sets one.", labels=["namespace", "budget"]
        )
        over = GaugeMetricFamily(
            "cozygpu_budget_over",
            "1 while a lowered budget is below what is held (OverBudget).",
            labels=["namespace", "budget"],
        )
        for (namespace, name), b in sorted(self._cluster.budgets.items()):
            for cls, n in sorted(b.status.used.items()):
                used.add_metric([namespace, name, cls], n)
            for cls, n in sorted(b.spec.limits.items()):
                limit.add_metric([namespace, name, cls], n)
            used_total.add_metric([namespace, name], b.status.used_total)
            if b.spec.total is not None:
                limit_total.add_metric([namespace, name], b.spec.total)
            over.add_metric([namespace, name], _condition_true(b.status.conditions, CONDITION_OVER_BUDGET))
        yield from (used, limit, used_total, limit_total, over)


def _condition_true(conditions: list[Condition], type_: str) -> int:
    return int(any(c.type == type_ and c.status is ConditionStatus.TRUE for c in conditions))
