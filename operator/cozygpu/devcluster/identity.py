"""The operator's identity on a dev control plane: a ServiceAccount with the chart's RBAC (§10).

Tests and the demo run the operator as this ServiceAccount, bound to exactly the rules the
Helm chart grants (`charts/cozy-gpu-operator/files/rbac/`), so every integration test also
proves those rules are enough. `tenant_roles` are the chart's ClusterRoles for tenants.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from cozygpu.devcluster.binaries import repo_root
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube import kinds
from cozygpu.kube.adapter import Body, Kube

NAMESPACE = "cozy-gpu-system"
NAME = "cozy-gpu-operator"
USERNAME = f"system:serviceaccount:{NAMESPACE}:{NAME}"
RBAC_DIR = repo_root() / "charts" / "cozy-gpu-operator" / "files" / "rbac"
RBAC = "rbac.authorization.k8s.io"

# `cozygpu run --dev` registers its own webhook configurations; in a cluster the chart installs them.
DEV_RULES = [
    {
        "apiGroups": ["admissionregistration.k8s.io"],
        "resources": ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"],
        "verbs": ["get", "create", "update", "delete"],
    }
]


def operator_rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = yaml.safe_load((RBAC_DIR / "operator.yaml").read_text())["rules"]
    return rules


def tenant_roles() -> list[Body]:
    """The tenants' ClusterRoles, with the labels that aggregate them into admin, edit and view."""
    roles = yaml.safe_load((RBAC_DIR / "tenant.yaml").read_text())["roles"]
    return [
        _cluster_role(r["name"], r["rules"], {f"{RBAC}/aggregate-to-{to}": "true" for to in r["aggregateTo"]})
        for r in roles
    ]


def _cluster_role(name: str, rules: list[dict[str, Any]], labels: dict[str, str] | None = None) -> Body:
    return {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRole", "metadata": {"name": name, "labels": labels or {}},
            "rules": rules}  # fmt: skip


def _binding(name: str, role: str) -> Body:
    return {
        "apiVersion": f"{RBAC}/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}],
    }


def leader_election_rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = yaml.safe_load((RBAC_DIR / "leader-election.yaml").read_text())["rules"]
    return rules


def install(kube: Kube, *, dev: bool = True) -> None:
    """The namespace, the ServiceAccount, the operator's roles and bindings (and --dev's extra rule)."""
    kube.put_object(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    kube.put_object(kinds.kind("ServiceAccount"), {"apiVersion": "v1", "kind": "ServiceAccount",
                                                   "metadata": {"name": NAME, "namespace": NAMESPACE}})  # fmt: skip
    roles = [(NAME, operator_rules())] + ([(f"{NAME}-dev", DEV_RULES)] if dev else [])
    for role, rules in roles:
        kube.put_object(kinds.kind("ClusterRole"), _cluster_role(role, rules))
        kube.put_object(kinds.kind("ClusterRoleBinding"), _binding(role, role))
    for body in tenant_roles():
        kube.put_object(kinds.kind("ClusterRole"), body)
    role = f"{NAME}-leader-election"
    kube.put_object(kinds.kind("Role"), {"apiVersion": f"{RBAC}/v1", "kind": "Role",
                                         "metadata": {"name": role, "namespace": NAMESPACE},
                                         "rules": leader_election_rules()})  # fmt: skip
    binding = _binding(role, role)
    binding.update(kind="RoleBinding", roleRef={"apiGroup": RBAC, "kind": "Role", "name": role})
    binding["metadata"]["namespace"] = NAMESPACE
    kube.put_object(kinds.kind("RoleBinding"), binding)


def write_kubeconfig(plane: ControlPlane, path: Path) -> Path:
    """Install the identity and write a kubeconfig that authenticates as the ServiceAccount."""
    kube = plane.kube()
    install(kube)
    return plane.write_token_kubeconfig(path, USERNAME, kube.request_token(NAMESPACE, NAME), namespace=NAMESPACE)
