"""What an admission executor raises instead of an answer (§3, §9, §12.2): one exception per kind of answer.

`Refusal` is a denial the tenant reads, naming the object at fault and the rule (a 403); `InternalError` is the API
failing the operator mid-check, which fails closed with an error, not a denial (a 500). Raised by the VMI webhook,
the pod webhook and validation; the gate (runtime.admission.gate) turns them into kopf's answers in one place.
"""

from __future__ import annotations


class Refusal(Exception):
    """A denial the tenant reads: which object, which rule."""


class InternalError(Exception):
    """The API failed us; the webhook fails closed with an error, not a denial."""
