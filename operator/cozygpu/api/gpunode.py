"""GPUNode (§1.3): what a node serves, kept by the operator. Cluster-scoped."""

from __future__ import annotations

from pydantic import Field

from cozygpu.api.meta import (
    AGE,
    CONDITIONS_SCHEMA,
    Condition,
    CRDInfo,
    Model,
    PrinterColumn,
    Resource,
)


class NodeResource(Model):
    name: str = Field(min_length=1, description="The device-plugin resource name.")
    allocatable: int = Field(ge=0, description="Units the Node reports allocatable.")
    held: int = Field(ge=0, description="Units held by Bound devices on the node.")
    free: int = Field(ge=0, description="allocatable - held, never below zero.")


class GPUNodeSpec(Model):
    """Empty: a GPUNode is named after its Node and has nothing to ask for."""


class GPUNodeStatus(Model):
    """Per resource: allocatable, held and free units; classes served; capacity conditions."""

    resources: list[NodeResource] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    classes: list[str] = Field(default_factory=list, description="The classes the node serves.")
    summary: str | None = Field(default=None, description="held/allocatable per resource, for kubectl.")
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=CONDITIONS_SCHEMA)


class GPUNode(Resource):
    crd = CRDInfo(
        kind="GPUNode",
        plural="gpunodes",
        singular="gpunode",
        namespaced=False,
        short_names=("gpund",),
        columns=(
            PrinterColumn("Held/Allocatable", ".status.summary"),
            PrinterColumn("LostCapacity", '.status.conditions[?(@.type=="LostCapacity")].status'),
            PrinterColumn("Conflict", '.status.conditions[?(@.type=="ClassConflict")].status', priority=1),
            AGE,
        ),
    )

    spec: GPUNodeSpec = Field(default_factory=GPUNodeSpec)
    status: GPUNodeStatus = Field(default_factory=GPUNodeStatus)
