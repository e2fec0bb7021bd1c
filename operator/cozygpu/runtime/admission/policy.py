"""No bypass (§12.1, §12.3): the ValidatingAdmissionPolicy the API server enforces on its own.

kube-scheduler knows nothing of held devices, so nothing may consume a managed GPU resource
(the `resourceName` of any GPUClass) behind the operator's back. What CEL can decide alone
lives here: it holds while the operator is down and costs no webhook round trip. Its
parameter is the managed resources, which the operator publishes in a ConfigMap of its
namespace (`parameter`, kept by runtime.admission.guard), not the GPUClasses themselves: an API server
resolves a custom kind as a parameter only once its discovery has caught up, and until then,
some 30 s after every restart, a fail-closed policy with one refuses every pod and VMI
create in the cluster (kubernetes/kubernetes#124237; measured here). A core kind always
resolves. A VMI without the device-reference label naming a managed resource is refused; so
is a labelled VMI that lacks the VMI webhook's mark (its configuration missing or deleted:
the pair fails closed rather than admit a VMI without its GPUs); so is a Pod asking for one
unless KubeVirt's controller renders it as a launcher (whose units and node the pod webhook
then checks, §12.2), and an update of such a pod that changes its `kubevirt.io` label or its
controller reference, which tell whose guest it runs (§6.7, issue 34 item 1). Namespaces are
exempt only by name, from the operator's settings (the chart's list), never by a label a
tenant's admin could set.

The VMI webhook's mark is an annotation whoever creates the VMI can write, so it cannot tell
alone whether the webhook ran. A second policy (`webhooks_policy`) takes the mutating webhook
configuration itself as its parameter (a built-in kind: it always resolves; found by its label):
while it is missing,
or no longer sends labelled VMIs and their launchers to us failing closed, those are refused, so a
forged mark and GPU entries of a VMI's own get nothing (issue 34 item 4). The builders return
objects; `cozygpu run --dev` registers them (runtime.admission.registration) and the chart ships
the same.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import yaml

from cozygpu.api import hooks
from cozygpu.api.names import (
    ANNOTATION_ADMITTED,
    ANNOTATION_DEVICES,
    LABEL_DEVICE_REFERENCE,
    LABEL_GUARD_PROBE,
    LABEL_WEBHOOKS,
    LAUNCHER,
    TRUE,
)

NAME = "cozy-gpu-operator-no-bypass"
# The parameter: a ConfigMap in the operator's namespace that it keeps (runtime.admission.guard).
MANAGED_RESOURCES = "cozy-gpu-managed-resources"
RESOURCES_KEY = "resources"
# The probe (`probe`): a ConfigMap the operator creates as a dry run, naming one resource; the policy refuses it
# while that resource is in the parameter the API server holds, with a message carrying PROBE_GUARDED.
PROBE_KEY = "resource"
PROBE_GUARDED = "is guarded by the no-bypass policy"
CONFIGMAPS_CREATE = {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"], "operations": ["CREATE"]}

_ASKS = (
    "(has({c}.resources) && ((has({c}.resources.requests) && r in {c}.resources.requests) || "
    "(has({c}.resources.limits) && r in {c}.resources.limits)))"
)


def _pod_asks(containers: str) -> str:
    return f"(has(object.spec.{containers}) && object.spec.{containers}.exists(c, {_ASKS.format(c='c')}))"


def _vmi_names(field: str) -> str:
    devices = "object.spec.domain.devices"
    return f"(has({devices}.{field}) && {devices}.{field}.exists(d, d.deviceName == r))"


def _same_guest(old: str, new: str) -> str:
    """Whether two versions of a pod tell the same guest: its `kubevirt.io` label and its controller references."""

    def label(pod: str) -> str:
        return f"(has({pod}.metadata.labels) ? {pod}.metadata.labels[?'kubevirt.io'].orValue('') : '')"

    def owners(pod: str) -> str:
        controllers = "filter(r, has(r.controller) && r.controller).map(r, r.uid)"
        return f"(has({pod}.metadata.ownerReferences) ? {pod}.metadata.ownerReferences.{controllers} : [])"

    return f"({label(old)} == {label(new)} && {owners(old)} == {owners(new)})"


def parameter(namespace: str, resources: Iterable[str]) -> dict[str, Any]:
    """The policy's parameter: the managed resources (every GPUClass's resourceName), comma-separated."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": MANAGED_RESOURCES, "namespace": namespace},
        "data": {RESOURCES_KEY: ",".join(sorted(set(resources)))},
    }


def probe(namespace: str, resource: str) -> dict[str, Any]:
    """What the guard creates as a dry run to see whether the API server guards `resource` (§12.3)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "generateName": "cozy-gpu-guard-probe-",
            "namespace": namespace,
            "labels": {LABEL_GUARD_PROBE: TRUE},
        },
        "data": {PROBE_KEY: resource},
    }


def policy(controller_user: str) -> dict[str, Any]:
    """The policy; `controller_user` is KubeVirt's controller identity, the only creator of launcher pods."""
    domain = "object.spec.domain"
    vmi_asks = " || ".join([_vmi_names("gpus"), _vmi_names("hostDevices"), f"({_ASKS.format(c=domain)})"])
    pod_asks = f"{_pod_asks('containers')} || {_pod_asks('initContainers')}"
    labelled = (
        f"has(object.metadata.labels) && object.metadata.labels[?{json.dumps(LABEL_DEVICE_REFERENCE)}]"
        ".orValue('') == 'true'"
    )
    marked = (
        f"has(object.metadata.annotations) && object.metadata.annotations[?{json.dumps(ANNOTATION_ADMITTED)}]"
        ".orValue('') == 'true'"
    )
    if "'" in controller_user or "\\" in controller_user:
        raise ValueError(f"KubeVirt's controller user {controller_user!r} cannot be put in a CEL string")
    launcher = (
        f"request.userInfo.username == '{controller_user}' && has(object.metadata.labels) && "
        "object.metadata.labels[?'kubevirt.io'].orValue('') == 'virt-launcher'"
    )
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": NAME},
        "spec": {
            "failurePolicy": "Fail",
            # A core kind, not GPUClass: see `parameter` and the module's docstring.
            "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
            "matchConstraints": {
                # What the VMI and pod webhooks admit (api.hooks): the policy guards what they would miss; pod
                # updates, which no webhook of ours sees; and the guard's probes (ConfigMaps with its label only).
                "resourceRules": [
                    hooks.VMI.rule(),
                    hooks.POD.rule(),
                    {**hooks.POD.rule(), "operations": ["UPDATE"]},
                    CONFIGMAPS_CREATE,
                ],
            },
            "matchConditions": [
                {
                    "name": "configmaps-are-probes",
                    "expression": "request.resource.resource != 'configmaps' || (has(object.metadata.labels) && "
                    f"object.metadata.labels[?{json.dumps(LABEL_GUARD_PROBE)}].orValue('') == 'true')",
                }
            ],
            "variables": [
                {
                    "name": "managed",
                    "expression": f"has(params.data) && has(params.data.{RESOURCES_KEY}) && "
                    f"params.data.{RESOURCES_KEY} != '' ? params.data.{RESOURCES_KEY}.split(',') : []",
                },
                {"name": "isVMI", "expression": f"request.resource.resource == '{hooks.VMI.kind.plural}'"},
                {"name": "isPod", "expression": f"request.resource.resource == '{hooks.POD.kind.plural}'"},
                # The managed resources the object asks for; each evaluated only for its own kind.
                {"name": "vmiAsks", "expression": f"variables.managed.filter(r, {vmi_asks})"},
                {"name": "podAsks", "expression": f"variables.managed.filter(r, {pod_asks})"},
            ],
            "validations": [
                {
                    # §12.1: labelled VMIs are the VMI webhook's (§3.8 refuses their own GPU entries).
                    "expression": f"!variables.isVMI || ({labelled}) || size(variables.vmiAsks) == 0",
                    "messageExpression": "'VMI ' + object.metadata.name + ' names ' + variables.vmiAsks[0] + "
                    "', a GPU resource the GPU operator manages, directly: GPUs are given to VMs through GPUDevices: "
                    f"label the VMI {LABEL_DEVICE_REFERENCE}=true and list its devices in the annotation "
                    f"{ANNOTATION_DEVICES}'",
                    "reason": "Forbidden",
                },
                {
                    # §12.3: a labelled VMI went through the VMI webhook, which stamps its mark; a VMI that did not
                    # (the mutating configuration missing, deleted, or mid-replacement) is refused, never admitted
                    # without its GPUs. KubeVirt retries the start.
                    "expression": f"!variables.isVMI || !({labelled}) || ({marked})",
                    "messageExpression": "'VMI ' + object.metadata.name + ' references GPUDevices but the VMI webhook "
                    f"of the GPU operator did not admit it (no {ANNOTATION_ADMITTED} mark): its "
                    "MutatingWebhookConfiguration is missing or the operator is being replaced; KubeVirt retries "
                    "the start'",
                    "reason": "Forbidden",
                },
                {
                    # §12.2, §12.3: only KubeVirt's launcher pods, which the pod webhook then pins.
                    "expression": f"!variables.isPod || request.operation != 'CREATE' || size(variables.podAsks) == 0 "
                    f"|| ({launcher})",
                    "messageExpression": "'Pod ' + object.metadata.name + ' asks for ' + variables.podAsks[0] + "
                    "', a GPU resource the GPU operator hands out: only KubeVirt launcher pods of VMs that "
                    "reference GPUDevices may ask for it'",
                    "reason": "Forbidden",
                },
                {
                    # §6.7: the operator and KubeVirt tell a launcher's guest by these; a tenant changing them would
                    # hide a running guest and have its units given to another while it runs (issue 34 item 1).
                    "expression": "!variables.isPod || request.operation != 'UPDATE' || size(variables.podAsks) == 0 "
                    f"|| {_same_guest('oldObject', 'object')}",
                    "messageExpression": "'Pod ' + object.metadata.name + ' holds ' + variables.podAsks[0] + "
                    "', a GPU resource the GPU operator hands out: its kubevirt.io label and its controller "
                    "reference tell whose guest it runs, and cannot change while it holds it'",
                    "reason": "Forbidden",
                },
                {
                    # The guard's probe: refused exactly while the parameter the API server holds names its
                    # resource, so a refusal shows the guard above is in force for it (runtime.admission.guard).
                    "expression": "variables.isVMI || variables.isPod || "
                    f"!(object.data[?'{PROBE_KEY}'].orValue('') in variables.managed)",
                    "messageExpression": f"'probe: ' + object.data['{PROBE_KEY}'] + ' {PROBE_GUARDED}'",
                    "reason": "Forbidden",
                },
            ],
        },
    }


# The second policy's name and its binding's: what it guards is that the operator's webhooks are asked at all.
WEBHOOKS_NAME = "cozy-gpu-operator-needs-its-webhooks"


def _serves(hook: hooks.Hook) -> str:
    """CEL: the parameter (a MutatingWebhookConfiguration) still sends `hook`'s reviews to its webhook, and fails
    closed when it cannot be reached."""
    kind = hook.kind.plural
    covers = (
        f"w.rules.exists(r, ('{kind}' in r.resources || '*' in r.resources) && "
        "('CREATE' in r.operations || '*' in r.operations))"
    )
    return f"params.webhooks.exists(w, w.name == '{hook.webhook}' && w.failurePolicy == 'Fail' && {covers})"


def webhooks_policy() -> dict[str, Any]:
    """§12.3, issue 34 item 4: a labelled VMI, or a launcher pod of one (KubeVirt copies the VMI's labels), only
    while the mutating configuration that sends it to the operator's webhook is in place. The mark alone would not
    do: the VMI's creator can write it, with GPU entries of its own, and nothing would pin or cap them."""
    launcher = f"has(object.metadata.labels) && object.metadata.labels[?'kubevirt.io'].orValue('') == '{LAUNCHER}'"
    refusal = (
        "' references GPUDevices, and the mutating webhook configuration of the GPU operator does not send it to "
        "the operator failing closed (it is missing, or its webhook was removed or set to Ignore): nothing would "
        "check, pin or count its GPUs, so it is refused; restore the configuration (the chart installs it)'"
    )
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": WEBHOOKS_NAME},
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration"},
            "matchConstraints": {
                "resourceRules": [hooks.VMI.rule(), hooks.POD.rule()],
                # KubeVirt copies a VMI's labels to its launcher pods.
                "objectSelector": {"matchLabels": {LABEL_DEVICE_REFERENCE: TRUE}},
            },
            "variables": [{"name": "isVMI", "expression": f"request.resource.resource == '{hooks.VMI.kind.plural}'"}],
            "validations": [
                {
                    "expression": f"!variables.isVMI || {_serves(hooks.VMI)}",
                    "messageExpression": f"'VMI ' + object.metadata.name + {refusal}",
                    "reason": "Forbidden",
                },
                {
                    "expression": f"variables.isVMI || !({launcher}) || {_serves(hooks.POD)}",
                    "messageExpression": "'Pod ' + (has(object.metadata.name) ? object.metadata.name : "
                    f"object.metadata.generateName) + ', a launcher of a VMI that' + {refusal}",
                    "reason": "Forbidden",
                },
            ],
        },
    }


def webhooks_binding(exempt: Sequence[str] = ()) -> dict[str, Any]:
    """The binding to the operator's mutating configurations, by their label (the chart's and `--dev`'s carry it,
    so either satisfies a policy the other left, and each found must pass); while none exists the policy refuses
    (parameterNotFoundAction Deny). Only cluster admins write webhook configurations."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": WEBHOOKS_NAME},
        "spec": {
            "policyName": WEBHOOKS_NAME,
            "paramRef": {"selector": {"matchLabels": {LABEL_WEBHOOKS: TRUE}}, "parameterNotFoundAction": "Deny"},
            "validationActions": ["Deny"],
            "matchResources": exempting(exempt),
        },
    }


# Set by the API server from the namespace's name, which no one can change: an exemption nobody can grant
# themselves by labelling a namespace.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def exempting(namespaces: Sequence[str]) -> dict[str, Any]:
    """The binding's matchResources: every namespace but the exempt ones, by name (§12.3)."""
    if not namespaces:
        return {}
    expression = {"key": NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": sorted(set(namespaces))}
    return {"namespaceSelector": {"matchExpressions": [expression]}}


def exempt_of(namespace: str, exempt: Sequence[str]) -> list[str]:
    """The namespaces the bindings exempt: never the operator's own, where the guard's probes are made (the chart's
    template drops it the same way; a test holds the two equal)."""
    return sorted(set(exempt) - {namespace})


def binding(namespace: str, exempt: Sequence[str] = ()) -> dict[str, Any]:
    """The parameter in the operator's `namespace`; until the operator has written it there is nothing to guard
    (parameterNotFoundAction Allow: a missing parameter must never refuse every pod in the cluster). `exempt`
    as `exempt_of` gives it."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": NAME},
        "spec": {
            "policyName": NAME,
            "paramRef": {"name": MANAGED_RESOURCES, "namespace": namespace, "parameterNotFoundAction": "Allow"},
            "validationActions": ["Deny"],
            "matchResources": exempting(exempt),
        },
    }


# The chart ships these objects as a file with KubeVirt's controller user left to its values.
CHART_USER = "__KUBEVIRT_CONTROLLER_USER__"
CHART_FILE = "no-bypass-policy.yaml"


def chart_file() -> str:
    """The policies as the chart's files/ hold them (`make chart-files` writes it); the chart's template renders the
    bindings, whose exempt namespaces are a value (a test holds them to `binding` and `webhooks_binding`)."""
    header = "# Generated from cozygpu.runtime.admission.policy by `make chart-files`; a test fails on drift.\n"
    documents = [policy(CHART_USER), webhooks_policy()]
    return header + yaml.safe_dump_all(documents, sort_keys=False, width=1000)
