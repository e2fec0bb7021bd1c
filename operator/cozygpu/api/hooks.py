"""The one table of the operator's admission webhooks: what each serves, for which kind and operations.

kopf's registration (runtime.process.handlers), the configurations the operator registers in dev mode
(runtime.admission.webhooks, which tests/integration/test_chart.py holds the chart's to), the no-bypass
policy's match rules (runtime.admission.policy) and the gate's metrics (runtime.admission.gate) all read it here,
so a hook's target is spelled once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cozygpu.api import kinds
from cozygpu.api.kinds import Kind
from cozygpu.api.names import GROUP


@dataclass(frozen=True)
class Hook:
    id: str  # kopf serves the hook at /<id>
    kind: Kind
    operations: tuple[str, ...]
    mutating: bool

    @property
    def webhook(self) -> str:
        """The name of its entry in a webhook configuration (the no-bypass policy looks for it there, §12.3)."""
        return f"{self.id}.{GROUP}"

    def rule(self) -> dict[str, Any]:
        """The admissionregistration rule that sends this hook's reviews (a webhook's or a policy's)."""
        return {
            "apiGroups": [self.kind.group],
            "apiVersions": [self.kind.version],
            "resources": [self.kind.plural],
            "operations": list(self.operations),
        }


# §3, §12.2: a VMI with device references is admitted with its set; a launcher pod is pinned.
VMI = Hook("vmi", kinds.VMI, ("CREATE",), mutating=True)
POD = Hook("pod", kinds.POD, ("CREATE",), mutating=True)
# §9: our own kinds are validated as they are created or changed.
DEVICE = Hook("gpudevice", kinds.GPU_DEVICE, ("CREATE", "UPDATE"), mutating=False)
CLASS = Hook("gpuclass", kinds.GPU_CLASS, ("CREATE", "UPDATE"), mutating=False)
BUDGET = Hook("gpubudget", kinds.GPU_BUDGET, ("CREATE", "UPDATE"), mutating=False)

HOOKS: tuple[Hook, ...] = (VMI, POD, DEVICE, CLASS, BUDGET)
