"""Admission of GPUDevice, GPUClass and GPUBudget (§9), as pure checks.

The validating webhooks (runtime.admission.validation) call these with the request's objects,
the requester's username and the operator's own; a returned string is the denial.
"""

from __future__ import annotations

from collections.abc import Sequence

from cozygpu.api import GPUBudget, GPUClass, GPUDevice
from cozygpu.api.names import LABEL_TEMPLATE_DEVICE
from cozygpu.api.references import valid_name
from cozygpu.decisions.budgets import check_orders
from cozygpu.decisions.orders import Order
from cozygpu.state.cluster import Cluster


def device_create(
    cluster: Cluster,
    device: GPUDevice,
    requester: str,
    operator: str,
    prior: Sequence[Order] = (),
    *,
    budgets_required: bool = False,
) -> str | None:
    """§9.1 CREATE: the class takes orders, the count fits, the order passes §7; template label is ours."""
    what = f"GPUDevice {device.name}"
    if device.metadata.resource_version:
        # The API server refuses it after the webhooks: reserved here, it would hold the budgets for nothing.
        return f"{what}: metadata.resourceVersion must not be set on a create"
    if device.carries_template_label and requester != operator:
        return f"{what}: only the GPU operator may create devices labelled {LABEL_TEMPLATE_DEVICE}"
    cls = cluster.classes.get(device.spec.class_name)
    if cls is None:
        return f"{what}: GPUClass {device.spec.class_name} does not exist"
    if cls.deleting:
        return f"{what}: GPUClass {cls.name} is being deleted and takes no new orders"
    limit = cls.effective_max_count()
    if limit is not None and device.spec.count > limit:
        return f"{what}: count {device.spec.count} exceeds the maxCount of {limit} of GPUClass {cls.name}"
    resource = cls.spec.resource_name
    most = cluster.capacity.most_units(resource)  # an index: a create does not walk the nodes
    if device.spec.count > most:
        return (
            f"{what}: no node has {device.spec.count} units of {resource}, so it could never be placed; "
            f"the most one has is {most}"
        )
    if device.carries_template_label:
        return None  # an order of its VMI's admission, checked there (§3.9) and at bind time (§5.4)
    order = Order(device.namespace or "", cls.name, device.spec.count, what)
    return check_orders(cluster, [order], prior, required=budgets_required)


def device_update(old: GPUDevice, new: GPUDevice, requester: str, operator: str) -> str | None:
    """§9.1 UPDATE: spec is immutable; only the operator adds, changes or removes the template label."""
    what = f"GPUDevice {new.name}"
    if old.spec != new.spec:
        return f"{what}: spec is immutable (className {old.spec.class_name}, count {old.spec.count})"
    before = old.metadata.labels.get(LABEL_TEMPLATE_DEVICE)
    after = new.metadata.labels.get(LABEL_TEMPLATE_DEVICE)
    if before != after and requester != operator:
        return f"{what}: only the GPU operator may add, change or remove the label {LABEL_TEMPLATE_DEVICE}"
    return None


def class_update(cluster: Cluster, old: GPUClass, new: GPUClass) -> str | None:
    """§9.2: resourceName (and, by the same reasoning, mode) is fixed while devices name the class."""
    if old.spec.resource_name == new.spec.resource_name and old.spec.mode == new.spec.mode:
        return None
    named = cluster.devices.count_of_class(new.name)
    if not named:
        return None
    field = "resourceName" if old.spec.resource_name != new.spec.resource_name else "mode"
    return f"GPUClass {new.name}: spec.{field} cannot change while {named} GPUDevices name the class"


def budget_warnings(cluster: Cluster, budget: GPUBudget) -> tuple[str | None, list[str]]:
    """§9.3: limits name classes; one that does not exist yet is allowed with a warning."""
    for name in budget.spec.limits:
        if not valid_name(name):
            return f"GPUBudget {budget.name}: spec.limits key {name!r} is not a valid GPUClass name", []
    missing = sorted(n for n in budget.spec.limits if n not in cluster.classes)
    warnings = [f"GPUBudget {budget.name}: GPUClass {n} does not exist (yet)" for n in missing]
    return None, warnings
