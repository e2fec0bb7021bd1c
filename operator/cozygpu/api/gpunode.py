"""GPUNode (§1.3): what a node serves, kept by the operator. Cluster-scoped."""

from __future__ import annotations

from typing import Annotated

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

# The most pods `status.unmanagedPods` names; `unmanagedPodCount` counts them all.
MAX_UNMANAGED_PODS = 20


class NodeResource(Model):
    name: str = Field(min_length=1, description="The device-plugin resource name.")
    allocatable: int = Field(ge=0, description="Units the Node reports allocatable.")
    held: int = Field(ge=0, description="Units held by Bound devices on the node.")
    unmanaged: int = Field(
        default=0,
        ge=0,
        description="Units held by pods the operator did not place: launchers of VMIs it did not admit, pods "
        "that predate the no-bypass policy or run where it is exempted, a launcher's units beyond its set's (§12). "
        "Not subtracted from free.",
    )
    free: int = Field(ge=0, description="allocatable - held, never below zero.")


class UnmanagedPod(Model):
    pod: str = Field(min_length=1, description="namespace/name of the pod.")
    vmi: str | None = Field(default=None, description="The VMI the pod is the launcher of, if it is one.")
    units: dict[str, Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict,
        description="Units per resource the pod holds that no device the operator placed accounts for.",
    )


class GPUNodeSpec(Model):
    """Empty: a GPUNode is named after its Node and has nothing to ask for."""


class GPUNodeStatus(Model):
    """Per resource: allocatable, held, unmanaged and free units; classes served; foreign pods; conditions."""

    resources: list[NodeResource] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    classes: list[str] = Field(default_factory=list, description="The classes the node serves.")
    summary: str | None = Field(default=None, description="held/allocatable per resource, for kubectl.")
    unmanaged_pods: list[UnmanagedPod] = Field(
        default_factory=list,
        description="Pods holding units of the node's resources that the operator did not place (§12), "
        f"at most {MAX_UNMANAGED_PODS}, by namespace and name; unmanagedPodCount says how many there are.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["pod"]},
    )
    unmanaged_pod_count: int | None = Field(
        default=None, ge=0, description="How many pods hold units the operator did not place (§12)."
    )
    evacuated: int | None = Field(
        default=None,
        ge=0,
        description="VMs the operator restarted (or stopped) off the node since it was cordoned (§6.8); unset when "
        "none, or once the node is uncordoned.",
    )
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
            PrinterColumn("UnmanagedPods", ".status.unmanagedPodCount", "integer", priority=1),
            AGE,
        ),
    )

    spec: GPUNodeSpec = Field(default_factory=GPUNodeSpec)
    status: GPUNodeStatus = Field(default_factory=GPUNodeStatus)
