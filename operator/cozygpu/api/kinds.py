"""The one table of the API resources the operator and its tools talk to, by kind.

A `Kind` is everything the adapter needs to build a URL (no discovery round trip), and the
key the view's stores, its `Change`s and its subscriptions are kept by (state.cluster,
runtime.view). `WATCHED` names the kinds the operator's own informers (runtime.watching.informer)
list and watch for the view, the resync (runtime.watching.resync) included; `VIEWED` adds the
launcher pods runtime.watching.podwatch feeds it. kopf watches nothing (runtime.process.handlers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cozygpu.api import KINDS
from cozygpu.api.names import API_VERSION, KUBEVIRT_API_VERSION


@dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    def key_of(self, body: dict[str, Any]) -> Any:
        """How the view and the informers key an object of this kind: (namespace, name), or its name alone."""
        meta = body.get("metadata") or {}
        name = meta.get("name") or ""
        return (meta.get("namespace") or "", name) if self.namespaced else name


def _ours() -> dict[str, Kind]:
    return {k.crd.kind: Kind(API_VERSION, k.crd.kind, k.crd.plural, k.crd.namespaced) for k in KINDS}


_ALL = {
    **_ours(),
    "Node": Kind("v1", "Node", "nodes", False),
    "Namespace": Kind("v1", "Namespace", "namespaces", False),
    "Event": Kind("v1", "Event", "events", True),
    "Pod": Kind("v1", "Pod", "pods", True),
    "ConfigMap": Kind("v1", "ConfigMap", "configmaps", True),
    "ServiceAccount": Kind("v1", "ServiceAccount", "serviceaccounts", True),
    "Service": Kind("v1", "Service", "services", True),
    "Secret": Kind("v1", "Secret", "secrets", True),
    "Deployment": Kind("apps/v1", "Deployment", "deployments", True),
    "NetworkPolicy": Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies", True),
    "PodDisruptionBudget": Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets", True),
    "Lease": Kind("coordination.k8s.io/v1", "Lease", "leases", True),
    "Role": Kind("rbac.authorization.k8s.io/v1", "Role", "roles", True),
    "VirtualMachineInstance": Kind(KUBEVIRT_API_VERSION, "VirtualMachineInstance", "virtualmachineinstances", True),
    "VirtualMachine": Kind(KUBEVIRT_API_VERSION, "VirtualMachine", "virtualmachines", True),
    "KubeVirt": Kind(KUBEVIRT_API_VERSION, "KubeVirt", "kubevirts", True),
    "CustomResourceDefinition": Kind(
        "apiextensions.k8s.io/v1", "CustomResourceDefinition", "customresourcedefinitions", False
    ),
    "MutatingWebhookConfiguration": Kind(
        "admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", "mutatingwebhookconfigurations", False
    ),
    "ValidatingWebhookConfiguration": Kind(
        "admissionregistration.k8s.io/v1",
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
        False,
    ),
    "ValidatingAdmissionPolicy": Kind(
        "admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy", "validatingadmissionpolicies", False
    ),
    "ValidatingAdmissionPolicyBinding": Kind(
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
        False,
    ),
    "SelfSubjectReview": Kind("authentication.k8s.io/v1", "SelfSubjectReview", "selfsubjectreviews", False),
    "TokenReview": Kind("authentication.k8s.io/v1", "TokenReview", "tokenreviews", False),
    "SubjectAccessReview": Kind("authorization.k8s.io/v1", "SubjectAccessReview", "subjectaccessreviews", False),
    "ClusterRole": Kind("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", False),
    "ClusterRoleBinding": Kind("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "clusterrolebindings", False),
    "RoleBinding": Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings", True),
}


def kind(name: str) -> Kind:
    try:
        return _ALL[name]
    except KeyError:
        raise KeyError(f"the adapter knows no kind {name!r}") from None


GPU_CLASS = kind("GPUClass")
GPU_DEVICE = kind("GPUDevice")
GPU_NODE = kind("GPUNode")
GPU_BUDGET = kind("GPUBudget")
NODE = kind("Node")
NAMESPACE = kind("Namespace")
VMI = kind("VirtualMachineInstance")
VM = kind("VirtualMachine")
POD = kind("Pod")
KUBEVIRT = kind("KubeVirt")
CRD = kind("CustomResourceDefinition")
MUTATING_WEBHOOKS = kind("MutatingWebhookConfiguration")
VALIDATING_WEBHOOKS = kind("ValidatingWebhookConfiguration")
POLICY = kind("ValidatingAdmissionPolicy")
POLICY_BINDING = kind("ValidatingAdmissionPolicyBinding")
TOKEN_REVIEW = kind("TokenReview")
SUBJECT_ACCESS_REVIEW = kind("SubjectAccessReview")

# Listed at start-up and on each resync, watched in between, kept in the view (§6.4).
# VMIs unfiltered on purpose: a label taken off a running VMI reaches a label-selected watch as a
# deletion, and the collector would release the devices attached to it (§6). The view keeps a
# VMI's uid only.
WATCHED: tuple[Kind, ...] = (GPU_CLASS, GPU_DEVICE, GPU_BUDGET, GPU_NODE, NODE, NAMESPACE, KUBEVIRT, VMI)
# Every kind the view keeps. Pods are not watched like the rest: no server-side selector finds them all, and a
# watch of every pod of a GPU cloud is what §13 forbids. runtime.watching.podwatch watches launcher pods by
# label and finds the rest (pods that predate the no-bypass policy, §12) by a periodic paged list.
VIEWED: tuple[Kind, ...] = (*WATCHED, POD)
