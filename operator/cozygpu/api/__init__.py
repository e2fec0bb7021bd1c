"""The GPU API of §1 as pydantic models, the bottom layer of the operator.

Nothing here does I/O. `names` holds the wire names of §1.5; `crdgen` turns the
models into the CRDs under `crds/`.
"""

from cozygpu.api.gpubudget import GPUBudget, GPUBudgetSpec, GPUBudgetStatus
from cozygpu.api.gpuclass import GPUClass, GPUClassSpec, GPUClassStatus, GPUMode, IdleMoves
from cozygpu.api.gpudevice import (
    Attachment,
    BindRequest,
    BindResult,
    GPUDevice,
    GPUDeviceSpec,
    GPUDeviceStatus,
    Phase,
)
from cozygpu.api.gpunode import GPUNode, GPUNodeStatus, NodeResource, UnmanagedPod
from cozygpu.api.meta import Condition, ConditionStatus, ObjectMeta, Resource

KINDS: tuple[type[Resource], ...] = (GPUClass, GPUDevice, GPUNode, GPUBudget)

__all__ = [
    "KINDS",
    "Attachment",
    "BindRequest",
    "BindResult",
    "Condition",
    "ConditionStatus",
    "GPUBudget",
    "GPUBudgetSpec",
    "GPUBudgetStatus",
    "GPUClass",
    "GPUClassSpec",
    "GPUClassStatus",
    "GPUDevice",
    "GPUDeviceSpec",
    "GPUDeviceStatus",
    "GPUMode",
    "GPUNode",
    "GPUNodeStatus",
    "IdleMoves",
    "NodeResource",
    "ObjectMeta",
    "Phase",
    "Resource",
    "UnmanagedPod",
]
