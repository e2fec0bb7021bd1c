"""GPUBudget (§1.4): what a tenant may order, in units per class and in total."""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, JsonValue

from cozygpu.api.meta import (
    AGE,
    CONDITIONS_SCHEMA,
    Condition,
    CRDInfo,
    Model,
    PrinterColumn,
    Resource,
    Time,
)
from cozygpu.api.selectors import LabelSelector

Units = Annotated[int, Field(ge=0)]


class GPUBudgetSpec(Model):
    """Caps on what namespaces covered by the budget may order (§7)."""

    limits: dict[str, Units] = Field(
        default_factory=dict, description="Units per GPUClass; a class not named is not limited unless total is set."
    )
    total: Units | None = Field(default=None, description="Units over all classes.")
    namespace_selector: LabelSelector | None = Field(
        default=None, description="Further namespaces the budget covers, besides its own."
    )


class BudgetOrder(Model):
    """An order admitted and not yet counted in `used` (§7.4): charged to the budget, as ResourceQuota charges its
    quota, until the count of the devices that exist (`used`) has it, or it expires (its device never came)."""

    namespace: str
    name: str = Field(description="The GPUDevice the order is for.")
    uid: str = Field(default="", description="The GPUDevice's uid: another device of the name is another order.")
    class_name: str
    count: int = Field(ge=1)
    expires: Time = Field(description="When the order leaves the budget if its device never came.")


class BudgetSetAside(Model):
    """Units one replica set aside on the budget (§7.4), charged as orders are, under its resourceVersion: the replica
    admits held creates and template orders within them without a write of its own per order, and writes them as
    orders at its next write of the budget. Every other replica counts them until they expire."""

    holder: str = Field(description="The replica (its identity and a mark of its process) that holds the units.")
    class_name: str
    units: int = Field(ge=1)
    expires: Time = Field(description="When the units leave the budget if the replica does not write it again.")


# An older operator knows neither record and would write a status without them, letting every replica forget
# orders admitted and units set aside (a rolling upgrade): the API server refuses such a write (fail closed).
KEEP_RECORDS: list[JsonValue] = [
    {"rule": f"!has(oldSelf.{field}) || has(self.{field})", "message": f"status.{field} may be emptied, not dropped"}
    for field in ("orders", "setAside")
]


class GPUBudgetStatus(Model):
    """What counts against the budget now; OverBudget when that exceeds a lowered cap."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": KEEP_RECORDS})

    used: dict[str, Units] = Field(default_factory=dict, description="Units counting against the budget, per class.")
    used_total: Units = Field(default=0, description="Units counting against the budget over all classes.")
    orders: list[BudgetOrder] = Field(
        default_factory=list, description="Orders admitted and not yet counted in used (§7.4), written by the operator."
    )
    ordered_total: Units = Field(default=0, description="Units of the orders not yet counted in used.")
    set_aside: list[BudgetSetAside] = Field(
        default_factory=list, description="Units replicas set aside for orders they admit without a write (§7.4)."
    )
    set_aside_total: Units = Field(default=0, description="Units set aside by replicas, over all classes.")
    counted_through: str = Field(
        default="", description="The GPUDevices' resourceVersion through which used counts them (§7.4)."
    )
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=CONDITIONS_SCHEMA)


class GPUBudget(Resource):
    crd = CRDInfo(
        kind="GPUBudget",
        plural="gpubudgets",
        singular="gpubudget",
        namespaced=True,
        short_names=("gpubdg",),
        columns=(
            PrinterColumn("Total", ".spec.total", "integer"),
            PrinterColumn("Used", ".status.usedTotal", "integer"),
            PrinterColumn("Ordered", ".status.orderedTotal", "integer"),
            PrinterColumn("SetAside", ".status.setAsideTotal", "integer"),
            PrinterColumn("OverBudget", '.status.conditions[?(@.type=="OverBudget")].status'),
            AGE,
        ),
    )

    spec: GPUBudgetSpec = Field(default_factory=GPUBudgetSpec)
    status: GPUBudgetStatus = Field(default_factory=GPUBudgetStatus)
