"""No bypass (§12.1, §12.3): the ValidatingAdmissionPolicy the API server enforces on its own.

kube-scheduler knows nothing of held devices, so nothing may consume a managed GPU resource
(the `resourceName` of any GPUClass) behind the operator's back. What CEL can decide alone
lives here, with the GPUClasses as the policy's parameters: it holds while the operator is
down and costs no webhook round trip. A VMI without the device-reference label naming a
managed resource is refused; so is a Pod asking for one unless KubeVirt's controller renders
it as a launcher (whose units and node the pod webhook then checks, §12.2). The builders
return objects; `cozygpu run --dev` registers them (runtime.app) and the chart ships the same.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from cozygpu.api.names import API_VERSION, LABEL_DEVICE_REFERENCE, LABEL_UNMANAGED_GPUS

NAME = "cozy-gpu-operator-no-bypass"

_ASKS = "(has({c}.resources) && ((has({c}.resources.requests) && variables.resource in {c}.resources.requests) || " \
        "(has({c}.resources.limits) && variables.resource in {c}.resources.limits)))"  # fmt: skip


def _pod_asks(containers: str) -> str:
    return f"(has(object.spec.{containers}) && object.spec.{containers}.exists(c, {_ASKS.format(c='c')}))"


def _vmi_names(field: str) -> str:
    devices = "object.spec.domain.devices"
    return f"(has({devices}.{field}) && {devices}.{field}.exists(d, d.deviceName == variables.resource))"


def policy(controller_user: str) -> dict[str, Any]:
    """The policy; `controller_user` is KubeVirt's controller identity, the only creator of launcher pods."""
    domain = "object.spec.domain"
    vmi_asks = " || ".join([_vmi_names("gpus"), _vmi_names("hostDevices"), f"({_ASKS.format(c=domain)})"])
    labelled = f"has(object.metadata.labels) && object.metadata.labels[?{json.dumps(LABEL_DEVICE_REFERENCE)}]" \
               ".orValue('') == 'true'"  # fmt: skip
    if "'" in controller_user or "\\" in controller_user:
        raise ValueError(f"KubeVirt's controller user {controller_user!r} cannot be put in a CEL string")
    launcher = f"request.userInfo.username == '{controller_user}' && has(object.metadata.labels) && " \
               "object.metadata.labels[?'kubevirt.io'].orValue('') == 'virt-launcher'"  # fmt: skip
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": NAME},
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": API_VERSION, "kind": "GPUClass"},
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["kubevirt.io"],
                        "apiVersions": ["v1"],
                        "resources": ["virtualmachineinstances"],
                        "operations": ["CREATE"],
                    },
                    {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE"]},
                ],
            },
            "variables": [
                {"name": "resource", "expression": "params.spec.resourceName"},
                {"name": "isVMI", "expression": "request.resource.resource == 'virtualmachineinstances'"},
            ],
            "validations": [
                {
                    # §12.1: labelled VMIs are the VMI webhook's (§3.8 refuses their own GPU entries).
                    "expression": f"!variables.isVMI || ({labelled}) || !({vmi_asks})",
                    "messageExpression": "'VMI ' + object.metadata.name + ' names ' + variables.resource + "
                    "', the resource of GPUClass ' + params.metadata.name + ', directly: GPUs are given to VMs "
                    f"through GPUDevices: label the VMI {LABEL_DEVICE_REFERENCE}=true and list its devices in the "
                    "annotation gpu.cozystack.io/devices'",
                    "reason": "Forbidden",
                },
                {
                    # §12.2, §12.3: only KubeVirt's launcher pods, which the pod webhook then pins.
                    "expression": f"variables.isVMI || !({_pod_asks('containers')} || "
                    f"{_pod_asks('initContainers')}) || ({launcher})",
                    "messageExpression": "'Pod ' + object.metadata.name + ' asks for ' + variables.resource + "
                    "', the resource of GPUClass ' + params.metadata.name + ', which the GPU operator hands out: "
                    "only KubeVirt launcher pods of VMs that reference GPUDevices may ask for it'",
                    "reason": "Forbidden",
                },
            ],
        },
    }


def binding() -> dict[str, Any]:
    """Every GPUClass is a parameter; with no class there is nothing to guard (parameterNotFoundAction Allow)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": NAME},
        "spec": {
            "policyName": NAME,
            "paramRef": {"selector": {}, "parameterNotFoundAction": "Allow"},
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchExpressions": [{"key": LABEL_UNMANAGED_GPUS, "operator": "DoesNotExist"}]}
            },
        },
    }


# The chart ships these objects as a file with KubeVirt's controller user left to its values.
CHART_USER = "__KUBEVIRT_CONTROLLER_USER__"
CHART_FILE = "no-bypass-policy.yaml"


def chart_file() -> str:
    """The policy and binding as the chart's files/ hold them (`make chart-policy` writes it)."""
    header = "# Generated from cozygpu.runtime.policy by `make chart-policy`; a test fails on drift.\n"
    return header + yaml.safe_dump_all([policy(CHART_USER), binding()], sort_keys=False, width=1000)
