"""The operator's settings (§10): one frozen pydantic model, passed to whoever needs it.

Built by the CLI from flags over environment variables (`COZYGPU_*`) over defaults.
No module reads the environment itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cozygpu.api import references
from cozygpu.api.names import is_namespace_name

ENV_PREFIX = "COZYGPU_"


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kubeconfig: Path | None = Field(default=None, description="Unset: in-cluster service account.")
    bind_timeout: float = Field(default=10.0, gt=0, le=29, description="How long the webhook waits for the binder.")
    webhook_timeout: float = Field(default=20.0, gt=0, le=30, description="The API server's timeout for our webhook.")
    drain_seconds: float = Field(
        default=3.0,
        ge=0,
        le=30,
        description="On SIGTERM, keep serving admissions this long, not ready and closing each connection after its"
        " answer, so a rolling upgrade fails none (§10); 0 with --dev, which serves only itself.",
    )
    webhook_connection_life: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Seconds a webhook connection is kept: the first answer after closes it, so the API server's"
        " next call goes through the Service again and a replica that joins gets its share (§10).",
    )
    webhook_peer_connections: int = Field(
        default=512,
        ge=1,
        description="Open connections one peer address may hold on the webhook port (§14.1); the next is closed"
        " before TLS starts. The API server opens one per call under way, up to its mutating in-flight limit.",
    )
    webhook_handshakes: int = Field(
        default=4,
        ge=1,
        description="TLS handshakes a replica runs at once on the webhook port (§14.1), handed round robin by peer"
        " address, so callers without a client certificate cannot keep its event loop busy with key exchanges.",
    )
    grace_period: float = Field(default=120.0, gt=0, description="Attachment grace period (§6.3), seconds.")
    sweep_interval: float = Field(default=60.0, gt=0, description="Safety-net sweep period (§6.4), seconds.")
    pod_scan_interval: float = Field(
        default=300.0, gt=0, description="Period of the paged list of every pod on a node (§12), seconds."
    )
    log_format: Literal["json", "console"] = "json"
    log_level: str = "INFO"
    health_host: str = "0.0.0.0"
    health_port: int = Field(default=8080, ge=0, le=65535)
    metrics_auth: bool = Field(
        default=True,
        description="Serve /metrics only to callers whose bearer token a TokenReview authenticates and a"
        " SubjectAccessReview allows `get` on /metrics (§14.4); off where the cluster fences metrics otherwise.",
    )
    binder: bool = Field(default=True, description="Off: admissions wait and time out (split roles, tests).")
    webhook_mode: Literal["cluster", "dev", "off"] = Field(
        default="cluster",
        description="cluster: serve with the chart's certificate; dev: self-signed, register ourselves; off: none.",
    )
    webhook_host: str = Field(default="0.0.0.0", description="Address the webhook server listens on.")
    webhook_port: int | None = Field(default=None, ge=1, le=65535, description="Unset: 9443, or any free port (dev).")
    webhook_client_ca: Path | None = Field(
        default=None,
        description="PEM CAs whose client certificates may call the webhooks (§14.1): set it where the API server"
        " presents one (AdmissionConfiguration); unset, any caller that reaches the port is served, so fence it"
        " with a NetworkPolicy. With --dev: the dev control plane's, when it publishes one.",
    )
    webhook_cert_dir: Path = Field(default=Path("/etc/cozygpu/tls"), description="tls.crt and tls.key (cluster).")
    no_bypass_policy: bool = Field(
        default=True,
        description="The no-bypass policy is installed (the chart's noBypassPolicy.enabled; --dev registers it):"
        " a GPUClass's devices take new units only once the policy is seen guarding its resource (§12.3).",
    )
    leader_election: bool = Field(default=True, description="Decide only while holding the Lease (§10).")
    identity: str = Field(default="", description="This replica in the Lease; unset: the host (pod) name.")
    lease_name: str = Field(default="cozy-gpu-operator", min_length=1)
    lease_namespace: str = Field(default="", description="Unset: the service account's or kubeconfig's namespace.")
    lease_duration: float = Field(default=15.0, ge=3, le=300, description="A leader's term, seconds.")
    api_concurrency: int = Field(
        default=32,
        ge=1,
        le=256,
        description="API calls in flight at once (binder writes, admissions, collector); as many connections kept.",
    )
    max_devices_per_vmi: int = Field(
        default=64,
        ge=1,
        le=references.MOST,
        description="Device references a VMI may list (§3.2); a set must fit one node, and the largest GPU nodes "
        "hold 8-16 GPUs or some tens of vGPUs.",
    )
    budgets_required: bool = Field(
        default=False,
        description="Refuse GPU orders in a namespace no GPUBudget covers (§7); off, such a namespace may order"
        " every free GPU.",
    )
    max_admissions_per_namespace: int = Field(
        default=128,
        ge=1,
        le=1024,
        description="VMI admissions one namespace may have under way at once (§14.3); more are refused at once, and"
        " KubeVirt retries: one tenant cannot hold every API call and bind of the operator. Above the burst of"
        " 100 concurrent creates §13.2 admits.",
    )
    budget_set_aside: int = Field(
        default=32,
        ge=0,
        le=1024,
        description="Units of a class a replica may set aside on a GPUBudget, at most a quarter of what the budget "
        "has left, to admit orders within them without a write of the budget each (§7.4, §13.5); other replicas "
        "count them until they are written as orders or let go. 0: every budgeted order writes its budgets.",
    )
    max_idle_moves: int = Field(
        default=4,
        ge=0,
        le=64,
        description="Idle held devices one placement may move to other nodes to make room for an order that fits "
        "nowhere (§5.7); 0: never. A class may forbid it for its own devices (spec.idleMoves: Never).",
    )
    evacuations_per_node: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Evacuations (§6.8) under way at once off one cordoned node: VMs restarting elsewhere and idle "
        "held devices moved to other nodes (like KubeVirt's parallelOutboundMigrationsPerNode).",
    )
    evacuations: int = Field(
        default=5,
        ge=1,
        le=256,
        description="Evacuations (§6.8) under way at once in the cluster (like KubeVirt's "
        "parallelMigrationsPerCluster).",
    )
    stop_bare_vmis: bool = Field(
        default=False,
        description="Whether a VMI no VirtualMachine controls is stopped (deleted) when KubeVirt marks it for "
        "evacuation off a node being drained (§6.8); nothing starts it again. Otherwise it keeps running, blocking "
        "the drain, with an Event and its node's GPUNode saying so.",
    )
    idle_move_after: float = Field(
        default=120,
        ge=0,
        le=86400,
        description="Seconds a held device must have been idle (Bound, attached to no VMI) before it may move for "
        "someone else (§5.7): a VM restarting or being started is never moved, and a moved device is idle anew, "
        "so a tenant cannot make another's device move more often than this.",
    )
    watch_timeout: int = Field(
        default=240,
        ge=1,
        le=3600,
        description="Seconds the API server holds each watch stream open; the operator then resumes it from the "
        "last version it saw (410 Gone: lists anew).",
    )
    crash_at_write: int = Field(
        default=0, ge=0, description="Tests only (tests/reliability): exit at once after the Nth API write lands."
    )
    exempt_namespaces: tuple[str, ...] = Field(
        default=(),
        description="Namespaces, by name, where §12 does not guard managed GPU resources (pods and VMIs may ask for"
        " them directly; the operator's own sets are still pinned and capped). None by default. By name, not label:"
        " a label is what anyone allowed to edit the namespace could set.",
    )
    kubevirt_controller_user: str = Field(
        default="system:serviceaccount:kubevirt:kubevirt-controller",
        min_length=1,
        description="KubeVirt's controller identity: the only creator of pods with managed GPUs (§12.2).",
    )

    @property
    def guarded(self) -> bool:
        """Whether the operator sees the no-bypass policy to: it is installed, and there are webhooks to keep it."""
        return self.no_bypass_policy and self.webhook_mode != "off"

    @field_validator("exempt_namespaces", mode="before")
    @classmethod
    def _namespace_list(cls, value: Any) -> Any:
        # COZYGPU_EXEMPT_NAMESPACES is a comma-separated list.
        return tuple(n.strip() for n in value.split(",") if n.strip()) if isinstance(value, str) else value

    @field_validator("exempt_namespaces")
    @classmethod
    def _namespace_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [n for n in value if not is_namespace_name(n)]
        if bad:
            raise ValueError(f"not namespace names (DNS labels): {', '.join(map(repr, bad))}")
        return value

    @model_validator(mode="after")
    def _bind_inside_webhook(self) -> Self:
        # §3: bind timeout < webhook timeout <= 30 s, so a refusal reaches the tenant.
        if self.bind_timeout >= self.webhook_timeout:
            raise ValueError(
                f"bind_timeout ({self.bind_timeout}s) must be shorter than webhook_timeout ({self.webhook_timeout}s)"
            )
        return self

    @classmethod
    def load(cls, env: Mapping[str, str], overrides: Mapping[str, Any]) -> Settings:
        """Flags (overrides, None meaning unset) over COZYGPU_* variables over defaults."""
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            key = ENV_PREFIX + name.upper()
            if key in env:
                values[name] = env[key]
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(values)
