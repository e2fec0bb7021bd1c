"""GPUDevice (§1.2): a tenant's GPUs, held or made from a VMI's template."""

from __future__ import annotations

import datetime as dt
from enum import StrEnum

from pydantic import Field

from cozygpu.api.meta import (
    AGE,
    CONDITIONS_SCHEMA,
    Condition,
    ConditionStatus,
    CRDInfo,
    Model,
    OwnerReference,
    PrinterColumn,
    Resource,
    Time,
)
from cozygpu.api.names import CONDITION_KEPT, LABEL_TEMPLATE_DEVICE, OBJECT_NAME_PATTERN, TRUE

IMMUTABLE = "self == oldSelf"


class Phase(StrEnum):
    PENDING = "Pending"
    BOUND = "Bound"
    LOST = "Lost"


class BindResult(StrEnum):
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class GPUDeviceSpec(Model):
    """What the tenant orders: units of one class, placed together on one node."""

    class_name: str = Field(
        min_length=1,
        max_length=253,
        pattern=OBJECT_NAME_PATTERN,
        description="The GPUClass to order. Immutable.",
        json_schema_extra={"x-kubernetes-validations": [{"rule": IMMUTABLE, "message": "spec.className is immutable"}]},
    )
    count: int = Field(
        ge=1,
        description="Units of the class, all on one node. Immutable.",
        json_schema_extra={"x-kubernetes-validations": [{"rule": IMMUTABLE, "message": "spec.count is immutable"}]},
    )


class Attachment(Model):
    vmi: str = Field(min_length=1, description="The VMI the device is attached to.")
    uid: str | None = Field(default=None, description="The VMI's uid, once that VMI exists.")
    since: Time | None = Field(default=None, description="When the attachment was made.")

    @property
    def claimed(self) -> bool:
        """A VMI object exists for it (its uid recorded): no longer an admission's to take back."""
        return self.uid is not None


class BindRequest(Model):
    """§4: what the webhook asks of the binder, and the binder's answer."""

    id: str = Field(min_length=1)
    vmi: str = Field(min_length=1)
    devices: list[str] = Field(min_length=1, description="Every device of the set, by name.")
    requested_at: Time
    result: BindResult | None = None
    message: str | None = None

    @property
    def open(self) -> bool:
        """§4: asked and not answered yet (an empty result); the binder answers it, the collector clears it stale."""
        return self.result is None


class GPUDeviceStatus(Model):
    """Written by the operator alone: where the units are and who uses them."""

    phase: Phase | None = Field(default=None, description="Unset until the operator sees the device.")
    node_name: str | None = Field(default=None, description="The node whose units it holds (Bound) or held (Lost).")
    attached_to: Attachment | None = None
    bind_request: BindRequest | None = None
    message: str | None = Field(default=None, description="Why the device waits or was lost.")
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=CONDITIONS_SCHEMA)


# §1.2 and §7.2: only Bound holds units; Pending, Bound and Lost count against budgets.
HOLDS_GPUS = frozenset({Phase.BOUND})
COUNTS_AGAINST_BUDGETS = frozenset({Phase.PENDING, Phase.BOUND, Phase.LOST})


class GPUDevice(Resource):
    crd = CRDInfo(
        kind="GPUDevice",
        plural="gpudevices",
        singular="gpudevice",
        namespaced=True,
        short_names=("gpudev",),
        columns=(
            PrinterColumn("Class", ".spec.className"),
            PrinterColumn("Count", ".spec.count", "integer"),
            PrinterColumn("Phase", ".status.phase"),
            PrinterColumn("Node", ".status.nodeName"),
            PrinterColumn("VMI", ".status.attachedTo.vmi"),
            AGE,
        ),
    )

    spec: GPUDeviceSpec
    status: GPUDeviceStatus = Field(default_factory=GPUDeviceStatus)

    @property
    def holds_gpus(self) -> bool:
        return self.status.phase in HOLDS_GPUS

    @property
    def counts_against_budgets(self) -> bool:
        return self.status.phase in COUNTS_AGAINST_BUDGETS

    @property
    def is_template(self) -> bool:
        """§1.2: made from a VMI's deviceTemplate, marked by the template label set to "true"."""
        return self.metadata.labels.get(LABEL_TEMPLATE_DEVICE) == TRUE

    @property
    def carries_template_label(self) -> bool:
        """§9.1: the template label with any value; only the operator may set it, so a tenant may not even
        create one labelled "false"."""
        return LABEL_TEMPLATE_DEVICE in self.metadata.labels

    def kept(self) -> GPUDevice:
        """The device as the view keeps it (issue 34 item 2): the labels the operator reads, no annotations. A
        tenant may make both as large as etcd allows on its own devices; every replica would hold them for nothing.
        Writes of a device's metadata are patches, so nothing left out here is written back missing."""
        meta = self.metadata
        labels = {k: v for k, v in meta.labels.items() if k == LABEL_TEMPLATE_DEVICE}
        if not meta.annotations and len(labels) == len(meta.labels):
            return self
        return self.model_copy(update={"metadata": meta.model_copy(update={"labels": labels, "annotations": {}})})

    @property
    def vmi_owner(self) -> OwnerReference | None:
        """§1.2, §6.1: the VMI a template device is owned by, once that VMI exists."""
        return next((o for o in self.metadata.owner_references if o.kind == "VirtualMachineInstance"), None)

    @property
    def vm_owner(self) -> OwnerReference | None:
        """§6.6: the VirtualMachine a template device is owned by, when its VMI was one that VM controlled."""
        return next((o for o in self.metadata.owner_references if o.kind == "VirtualMachine"), None)

    @property
    def kept_since(self) -> dt.datetime | None:
        """§6.6: since when it is kept for its VirtualMachine's next VMI, if it is."""
        kept = next((c for c in self.status.conditions if c.type == CONDITION_KEPT), None)
        if kept is None or kept.status != ConditionStatus.TRUE:
            return None
        return kept.last_transition_time

    @property
    def open_request(self) -> BindRequest | None:
        """§4: the bind request it carries, while the binder has not answered it."""
        request = self.status.bind_request
        return request if request is not None and request.open else None

    @property
    def in_use(self) -> bool:
        """§7.2: what a budget counts: Pending, Bound and Lost devices, and a held device admitted but not yet
        seen by the binder (it turns Pending the moment it is). A new template device is an order, not use."""
        if self.counts_against_budgets:
            return True
        return self.status.phase is None and not self.is_template

    @property
    def idle(self) -> bool:
        """§5.7: a reservation no guest uses and no admission is taking: a held device Bound, attached to no VMI,
        in no open request, not on its way out. Template devices never are: theirs is a VMI's lifetime (§6.6)."""
        if not self.holds_gpus or self.is_template or self.deleting:
            return False
        return self.status.attached_to is None and self.open_request is None

    @property
    def awaits_node(self) -> bool:
        """§5.5: the binder places it on its own, outside any bind request: not Bound, not on its way out,
        in no open request (answered as a set, §4), not a template device its admission has not handed
        over yet, and not Lost while still attached (§2: its VMI goes first)."""
        if self.holds_gpus or self.deleting or self.open_request is not None:
            return False
        if self.status.phase is None and self.is_template:
            return False
        return not (self.status.phase is Phase.LOST and self.status.attached_to is not None)
