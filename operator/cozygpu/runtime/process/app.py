"""The operator process, as wiring: one cluster view and its door, the one writer, the workers.

`Operator` is what the kopf handlers (runtime.process.handlers) call for start-up and clean-up;
their admission handlers go to the gate (runtime.admission.gate). The informers
(runtime.watching.informer, runtime.watching.podwatch) feed the view's door (runtime.view), whose changes
wake the workers that subscribed. `startup` seeds the view with a resync
(runtime.watching.resync), learns its own identity, keeps the watches going and serves the
webhooks (runtime.admission.registration) under supervision (runtime.process.supervision) and
reports ready, on every replica (§10); on the Lease holder alone it then starts the binder, the
collector, the accountant and the guard (and in dev mode registers the webhooks).

kopf's login is kube.credentials'; its settings, webhook server and the client CA are
runtime.process.serving's; what ready means is runtime.process.health's, over a snapshot taken
here; how a signal drains and what ends the process is runtime.process.stopping's.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import kopf
import structlog

from cozygpu.api import kinds
from cozygpu.api.kinds import Kind
from cozygpu.decisions.outputs import DEVICE_PLUGIN
from cozygpu.kube.adapter import Kube, ThreadedKube
from cozygpu.runtime.admission.calls import Turns
from cozygpu.runtime.admission.gate import Gate
from cozygpu.runtime.admission.guard import ManagedResources
from cozygpu.runtime.admission.pod_webhook import LauncherAdmission
from cozygpu.runtime.admission.registration import Registration
from cozygpu.runtime.admission.reservations import Reservations
from cozygpu.runtime.admission.validation import Validation
from cozygpu.runtime.admission.vmi_webhook import VMIAdmission
from cozygpu.runtime.admission.waiters import Waiters
from cozygpu.runtime.charges import Charges
from cozygpu.runtime.events import Recorder
from cozygpu.runtime.metrics import Metrics
from cozygpu.runtime.process import health, leadership, serving
from cozygpu.runtime.process.health import HealthServer
from cozygpu.runtime.process.ledger import take_over_ledger
from cozygpu.runtime.process.metrics_auth import MetricsGuard
from cozygpu.runtime.process.stopping import Stopping
from cozygpu.runtime.process.supervision import Supervisor
from cozygpu.runtime.view import View
from cozygpu.runtime.watching.informer import Informer
from cozygpu.runtime.watching.podwatch import PodWatch
from cozygpu.runtime.watching.resync import Resync
from cozygpu.runtime.workers.accountant import Accountant
from cozygpu.runtime.workers.binder import Binder
from cozygpu.runtime.workers.collector import Collector
from cozygpu.runtime.writes import Writer
from cozygpu.settings import Settings
from cozygpu.state.cluster import Cluster

log = structlog.get_logger("cozygpu.operator")
CLEANUP_STEP = 3.0  # seconds each API call of the clean-up may take before it is given up


class Operator:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        connections = settings.api_concurrency
        sync = (
            Kube.from_kubeconfig(settings.kubeconfig, connections=connections)
            if settings.kubeconfig
            else Kube.in_cluster(connections=connections)
        )
        self.kube = ThreadedKube(sync, workers=connections)
        self.cluster = Cluster()
        self.view = View(self.cluster)
        self.writer = Writer(self.view, self.kube, crash_at=settings.crash_at_write)
        self.metrics = Metrics(self.cluster)
        self.waiters = Waiters()
        self.reservations = Reservations(ttl=settings.webhook_timeout + 10)
        self.events = Recorder(self.kube)
        self.accountant = Accountant(self.cluster, self.writer, stop_bare=settings.stop_bare_vmis)
        # The operator's own namespace: its Lease, the no-bypass policy's parameter (§12.3).
        self.namespace = leadership.lease_namespace(settings)
        # An order a budget can refuse, from any replica's webhook or the leader's binder, is charged to it (§7.4, §10).
        self.charges = Charges(
            self.cluster,
            self.writer,
            ttl=settings.webhook_timeout + 10,
            mine=self.reservations.holds_device,
            reserved=self.reservations.prior,
            # Unique to this run: units a replica set aside before a restart are not its to admit within after it.
            holder=f"{leadership.replica(settings)}/{secrets.token_hex(4)}",
            set_aside=settings.budget_set_aside,
        )
        self.binder = Binder(
            self.cluster,
            self.writer,
            incomplete_after=settings.bind_timeout,
            concurrency=connections,
            reserved=self.reservations.prior,
            budgets_required=settings.budgets_required,
            guarded=settings.guarded,
            events=self.events,
            metrics=self.metrics,
            charges=self.charges,
            idle_moves=settings.max_idle_moves,
            idle_after=settings.idle_move_after,
            evacuations_per_node=settings.evacuations_per_node,
            evacuations=settings.evacuations,
            stop_bare=settings.stop_bare_vmis,
        )
        self.collector = Collector(
            self.cluster,
            self.writer,
            self.events,
            grace=settings.grace_period,
            sweep_interval=settings.sweep_interval,
            read_vm=lambda ns, name: self.kube.get_or_none(kinds.VM, name, ns),
        )
        # How an admitted set reaches its guest (decisions.outputs): a second output is chosen here, for both webhooks.
        output = DEVICE_PLUGIN
        self.vmis = VMIAdmission(
            self.cluster,
            self.waiters,
            self.reservations,
            bind_timeout=settings.bind_timeout,
            max_devices=settings.max_devices_per_vmi,
            max_per_namespace=settings.max_admissions_per_namespace,
            budgets_required=settings.budgets_required,
            writer=self.writer,
            events=self.events,
            calls_in_flight=max(2, connections // 8),
            # Admissions take their API calls in turns by namespace, leaving a quarter of the pool to the workers.
            turns=Turns(max(1, connections * 3 // 4)),
            output=output,
            answer=self.binder.answer_at_once if settings.binder else None,
        )
        self.validation = Validation(
            self.cluster,
            self.reservations,
            budgets_required=settings.budgets_required,
            exists=self._exists,
            charges=self.charges,
        )
        self.gate = Gate(
            self.vmis,
            LauncherAdmission(
                self.cluster, settings.kubevirt_controller_user, frozenset(settings.exempt_namespaces), output
            ),
            self.validation,
            self.metrics,
            synced=lambda: self.synced,
        )
        self.informers = [
            Informer(self.view, self.kube, kind, timeout=settings.watch_timeout) for kind in kinds.WATCHED
        ]
        self._resync = Resync(self.informers)
        self.pods = PodWatch(
            self.view,
            self.kube,
            self.writer,
            scan_interval=settings.pod_scan_interval,
            recheck_interval=settings.sweep_interval,
            watch_timeout=settings.watch_timeout,
        )
        self.registration = Registration(settings, self.kube, self.namespace)
        self.guard = ManagedResources(
            self.cluster,
            self.kube,
            self.writer,
            self.namespace,
            interval=settings.sweep_interval,
            guarded=settings.guarded,
            settle=self.pods.settle,
            placed=self.pods.placed,
        )
        # A task that really died ends the process: the kubelet starts a whole one again (§10).
        # Set to stop kopf (runtime.process.handlers); on a signal, only once admissions have drained.
        self.shutdown = Stopping(settings.drain_seconds if settings.webhook_mode == "cluster" else 0.0)
        self.supervisor = Supervisor(on_death=self.shutdown.end)
        self.health = HealthServer(
            settings.health_host,
            settings.health_port,
            self.readiness,
            self.metrics.render_off_loop,
            self.liveness,
            guard=MetricsGuard(self.kube) if settings.metrics_auth else None,
        )
        self.leadership = leadership.for_settings(settings, self.kube, on_lost=self._lost)
        self.metrics.ready.set_function(lambda: float(self.readiness()[0]))
        self.metrics.leader.set_function(lambda: float(self.deciding))
        self._not_leading = "not the leader yet"
        self.synced = False
        self.deciding = False  # the Lease holder's workers run (§10)
        self._tasks: list[asyncio.Task[None]] = []
        # Who hears of which changes: each worker keeps its own queue from them.
        self.view.subscribe(self.reservations.changed, kinds.GPU_DEVICE)
        self.view.subscribe(self.collector.changed, kinds.GPU_DEVICE, kinds.VMI, kinds.GPU_CLASS, kinds.POD)
        self.view.subscribe(self.accountant.changed)
        self.view.subscribe(self.guard.changed, kinds.GPU_CLASS)
        self.view.subscribe(self.waiters.changed, kinds.GPU_DEVICE)  # an admission hears of its own devices only
        self.view.subscribe(self.binder.changed)  # heard once it runs, on the Lease holder (§10)

    # -- readiness ---------------------------------------------------------

    def readiness(self) -> tuple[bool, str]:
        """The rule is runtime.process.health's; this is what it reads of this replica now."""
        role = ""
        if self.leadership is not None:
            role = "leader" if self.leadership.leading else f"standby, {self._not_leading}"
        replica = health.Replica(
            stopping=self.shutdown.stopping,
            synced=self.synced,
            serving=self.registration.ready,
            unregistered=self.settings.webhook_mode == "dev" and not self.registration.registered,
            stopped=[t.get_name() for t in self._tasks if t.done()],
            failing=list(self.supervisor.failing().items()),
            watches=[(i.kind.plural, i.failing) for i in self.informers + self.pods.informers if i.failing is not None],
            role=role,
        )
        return health.readiness(replica)

    def liveness(self) -> tuple[bool, str]:
        dead = sorted(self.supervisor.dead().items())
        if dead:
            name, how = dead[0]
            return False, f"{name} {how}; the process is ending"
        return True, ""

    # -- events --------------------------------------------------------------

    async def _exists(self, kind: Kind, namespace: str, name: str) -> bool:
        # Through the writer: what the fresh read finds reaches the view too (issue 20 item 4).
        return (await self.writer.read(kind, name, namespace)).body is not None

    # -- lifecycle -------------------------------------------------------------

    async def configure(self, settings: kopf.OperatorSettings) -> None:
        """kopf's settings and webhook server, with the client CA found first (runtime.process.serving)."""
        ca = await serving.client_ca(self.settings, self.kube)
        serving.configure(
            settings,
            self.settings,
            self.registration,
            ca,
            closing=lambda: self.shutdown.stopping,
            refused=lambda reason: self.metrics.refused_connections.labels(reason).inc(),
        )

    async def startup(self) -> None:
        """Every replica lists, watches and, once synced, serves admissions (§10); the Lease holder alone decides
        and writes what the workers write. A standby keeps its view warm, so taking the Lease costs no list."""
        await self.health.start()
        await self._resync.once(resume=True)  # the view seeded; each kind's watch goes on from its list
        await self.pods.start()
        self.validation.operator_user = await self.kube.whoami()
        # Orders an older version recorded in its ledger still count, and it can record no more (runtime.charges).
        self.charges.legacy = await take_over_ledger(self.kube, self.namespace)
        self.synced = True
        interval = self.settings.sweep_interval
        shared: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {
            "resync": lambda: self._resync.every(interval),
            "pods": self.pods.run,
            **{f"watch-{i.kind.plural}": i.run for i in self.informers},
        }
        if self.settings.webhook_mode != "off":
            shared["webhooks"] = self.registration.serve
        # Each task started again after any failure (runtime.process.supervision).
        self._tasks = [self.supervisor.start(name, run) for name, run in shared.items()]
        log.info(
            "operator.synced",
            devices=len(self.cluster.devices),
            nodes=len(self.cluster.capacity.nodes),
            classes=len(self.cluster.classes),
            identity=self.validation.operator_user,
            health_port=self.health.port,
        )
        if self.leadership is None:
            self._decide()
        else:
            # Leadership is not restarted: a renewal that fails is its own business, and losing the Lease ends the
            # process (§10); the replica's webhooks serve meanwhile.
            self._tasks.append(self.supervisor.start("leadership", self._lead, restart=False))

    async def _lead(self) -> None:
        assert self.leadership is not None
        await self.leadership.acquire(self._waiting)
        self._decide()
        await self.leadership.hold()

    def _decide(self) -> None:
        """Start what only the Lease holder runs: the binder, the collector, the accountant, the guard of the
        no-bypass policy's parameter and, in dev mode, the webhooks' registration."""
        workers: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {
            "accountant": self.accountant.run,
            "collector": self.collector.run,
        }
        if self.settings.binder:
            workers["binder"] = self.binder.run
        if self.settings.webhook_mode != "off":
            workers["guard"] = self.guard.run
            workers["registration"] = lambda: self.registration.register(self.validation.operator_user)
        self.deciding = True
        self._tasks += [self.supervisor.start(name, run) for name, run in workers.items()]
        log.info("operator.deciding", identity=self.leadership.identity if self.leadership else None)

    async def resync(self) -> int:
        """List every kind and make the view agree (§6.4); returns how many objects it had lost track of."""
        return await self._resync.once()

    def _waiting(self, why: str) -> None:
        if why != self._not_leading:
            log.info("leader.waiting", reason=why)
        self._not_leading = why

    def _lost(self) -> None:
        """Another replica may be deciding now: stop every writer at once, then the process."""
        for task in self._tasks:
            if task.get_name() != "leadership":
                task.cancel()
        self._not_leading = "the Lease was lost"
        self.shutdown.end()

    async def cleanup(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.charges.close()
        await self.events.close()
        # Each bounded: with no API server the process must still end (kopf retries a clean-up that raises).
        if self.leadership is not None:
            await _at_most(CLEANUP_STEP, "leader.release", self.leadership.release())
        await _at_most(CLEANUP_STEP, "webhooks.unregister", self.registration.unregister())
        await self.health.stop()
        self.kube.close()
        log.info("operator.stopped")


async def _at_most(seconds: float, step: str, work: Awaitable[None]) -> None:
    try:
        await asyncio.wait_for(work, seconds)
    except Exception as e:  # a connection refused, a timeout: the Lease expires on its own, configurations stay
        log.warning("operator.cleanup_failed", step=step, error=str(e) or type(e).__name__)
