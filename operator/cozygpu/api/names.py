"""The names of §1.5 and the API group, in one place.

Every module that reads or writes a label, annotation, finalizer or derived name
imports it from here, so the wire contract is spelled exactly once.
"""

from __future__ import annotations

import re

GROUP = "gpu.cozystack.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

KUBEVIRT_GROUP = "kubevirt.io"
KUBEVIRT_VERSION = "v1"
KUBEVIRT_API_VERSION = f"{KUBEVIRT_GROUP}/{KUBEVIRT_VERSION}"
# virt-controller's label on every pod it renders for a VMI (launchers, migration targets).
LABEL_KUBEVIRT = KUBEVIRT_GROUP
LAUNCHER = "virt-launcher"
# KubeVirt's own devices, asked for by every launcher pod: not GPUs.
KUBEVIRT_DEVICES = f"devices.{KUBEVIRT_GROUP}/"

TRUE = "true"

# On VMIs (§1.5).
LABEL_DEVICE_REFERENCE = f"{GROUP}/device-reference"
LABEL_MODE = f"{GROUP}/mode"
ANNOTATION_DEVICES = f"{GROUP}/devices"
# Stamped by the VMI webhook on every labelled VMI it admits; the no-bypass policy refuses a labelled VMI without
# it, so a missing or deleted mutating configuration fails closed (§12.3).
ANNOTATION_ADMITTED = f"{GROUP}/admitted"
# On the operator's MutatingWebhookConfiguration (the chart's and `--dev`'s): the second no-bypass policy selects
# it as its parameter by this label, and refuses labelled VMIs while none is found (§12.3, issue 34 item 4).
LABEL_WEBHOOKS = f"{GROUP}/webhooks"

# On GPUDevices (§1.2).
LABEL_TEMPLATE_DEVICE = f"{GROUP}/template-device"

# On the dry-run ConfigMaps the operator probes the no-bypass policy with: the policy refuses one naming a managed
# resource, which shows the API server guards that resource (§12.3).
LABEL_GUARD_PROBE = f"{GROUP}/guard-probe"

# On GPUDevices attached to a live VMI and on GPUClasses still named by a device (§6.5).
FINALIZER_IN_USE = f"{GROUP}/in-use-protection"

# Condition types (§1.3, §1.4, §5.5).
CONDITION_LOST_CAPACITY = "LostCapacity"
CONDITION_CLASS_CONFLICT = "ClassConflict"
# A GPUNode's: VMs marked for evacuation off the node being drained, and those that cannot leave (§6.8).
CONDITION_EVACUATION = "Evacuation"
CONDITION_OVER_BUDGET = "OverBudget"
CONDITION_PLACED = "Placed"
# The Placed reason of a device held on the node its VM restarts on, off a node being drained (§6.8).
REASON_EVACUATING = "Evacuating"
# §6.6: a template device kept Bound for its VirtualMachine's next VMI; since when, in its lastTransitionTime.
CONDITION_KEPT = "KeptForRestart"
# §12.3: on a GPUClass, True once the no-bypass policy is seen guarding its resource; its devices take new units only
# then, so no plain pod admitted while the API server's copy of the policy's parameter lags shares them.
CONDITION_READY = "Ready"

GPU_ENTRY_PREFIX = "gpudev"


# §14.1 with --dev: where a dev control plane publishes the CA of the client certificate its API server presents
# to webhooks (its AdmissionConfiguration); `cozygpu run --dev` then requires that certificate.
DEV_NAMESPACE = "cozy-gpu-system"
DEV_WEBHOOK_CLIENT_CA = "cozy-gpu-webhook-client-ca"  # a ConfigMap, its CA in `ca.crt`

# Object names as Kubernetes checks them (DNS-1123 subdomain).
OBJECT_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
OBJECT_NAME_MAX = 253


def is_object_name(name: str) -> bool:
    return len(name) <= OBJECT_NAME_MAX and re.fullmatch(OBJECT_NAME_PATTERN, name) is not None


def is_namespace_name(name: str) -> bool:
    """A namespace name is a DNS-1123 label: at most 63 characters, no dots."""
    return len(name) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) is not None


def template_device_name(vmi: str, index: int) -> str:
    """The GPUDevice a VMI's template entry `index` produces; predictable on purpose."""
    return f"{vmi}-gpu-{index}"


def gpu_entry_name(index: int, unit: int) -> str:
    """The KubeVirt `gpus` entry for unit `unit` of the VMI's device entry `index`."""
    return f"{GPU_ENTRY_PREFIX}{index}-{unit}"
