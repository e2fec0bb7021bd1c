"""GPUClass (§1.1): a kind of GPU that tenants can order. Cluster-scoped."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from cozygpu.api.meta import (
    AGE,
    CONDITIONS_SCHEMA,
    Condition,
    ConditionStatus,
    CRDInfo,
    Model,
    PrinterColumn,
    Resource,
)
from cozygpu.api.names import CONDITION_READY
from cozygpu.api.selectors import LabelSelector, Toleration

# A device-plugin resource name: an optional DNS prefix, a slash, a name.
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
RESOURCE_NAME_PATTERN = rf"^({_DNS_LABEL}(\.{_DNS_LABEL})*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"


class GPUMode(StrEnum):
    PASSTHROUGH = "passthrough"
    VGPU = "vgpu"


class IdleMoves(StrEnum):
    """§5.7: whether the binder may move this class's idle held devices to make room for an order."""

    ALLOWED = "Allowed"
    NEVER = "Never"


class GPUClassSpec(Model):
    """A kind of GPU: its mode, its device-plugin resource and which nodes serve it."""

    mode: GPUMode = Field(description="passthrough: a whole PCI GPU per unit; vgpu: one vGPU slice per unit.")
    resource_name: str = Field(
        min_length=1,
        max_length=253,
        pattern=RESOURCE_NAME_PATTERN,
        description="The device-plugin resource KubeVirt requests, e.g. nvidia.com/GA102GL_A10.",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Labels a node must carry to serve the class."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Taints on GPU nodes the class's devices tolerate."
    )
    max_count: int | None = Field(
        default=None,
        ge=1,
        description="Most units one VM may take. Unset: 1 for vgpu, no limit for passthrough.",
    )
    namespace_selector: LabelSelector | None = Field(
        default=None, description="Namespaces entitled to order the class. Unset: every namespace."
    )
    idle_moves: IdleMoves = Field(
        default=IdleMoves.ALLOWED,
        description="Allowed: an idle held device of the class (Bound, attached to no VMI) may move to another "
        "node to make room for an order that fits nowhere else. Never: it stays on its node, e.g. where VMs "
        "keep node-local disks.",
    )


# The most nodes `status.nodes` names; `nodeCount` counts them all. Unbounded, a class served by every node of a
# large cloud would carry thousands of names in each status write, and every replica's watch would read them.
MAX_CLASS_NODES = 100


class GPUClassStatus(Model):
    """Informational: the nodes serving the class and their units."""

    nodes: list[str] = Field(
        default_factory=list,
        description=f"Nodes that serve the class, at most {MAX_CLASS_NODES}, by name; nodeCount says how many.",
    )
    node_count: int = Field(default=0, ge=0, description="How many nodes serve the class.")
    allocatable: int = Field(default=0, ge=0, description="Units the serving nodes have.")
    held: int = Field(default=0, ge=0, description="Units held by Bound devices of the class.")
    free: int = Field(default=0, ge=0, description="Units of the class's resource not held on serving nodes.")
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=CONDITIONS_SCHEMA)


class GPUClass(Resource):
    crd = CRDInfo(
        kind="GPUClass",
        plural="gpuclasses",
        singular="gpuclass",
        namespaced=False,
        short_names=("gpucls",),
        columns=(
            PrinterColumn("Mode", ".spec.mode"),
            PrinterColumn("Resource", ".spec.resourceName"),
            PrinterColumn("MaxCount", ".spec.maxCount", "integer"),
            PrinterColumn("Nodes", ".status.nodeCount", "integer"),
            PrinterColumn("Free", ".status.free", "integer"),
            PrinterColumn("Ready", '.status.conditions[?(@.type=="Ready")].status'),
            AGE,
        ),
    )

    spec: GPUClassSpec
    status: GPUClassStatus = Field(default_factory=GPUClassStatus)

    def ready(self) -> bool:
        """§12.3: whether devices of the class may take new units: the operator saw the no-bypass policy refuse
        plain pods asking for its resource, for the spec as it is now (the condition's generation)."""
        ready = next((c for c in self.status.conditions if c.type == CONDITION_READY), None)
        return (
            ready is not None
            and ready.status is ConditionStatus.TRUE
            and ready.observed_generation == self.metadata.generation
        )

    def effective_max_count(self) -> int | None:
        """§1.1: maxCount when set; 1 for vgpu without it; None (no limit) for passthrough."""
        if self.spec.max_count is not None:
            return self.spec.max_count
        return 1 if self.spec.mode is GPUMode.VGPU else None
