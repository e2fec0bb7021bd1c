"""The operator's identity on a dev control plane: a ServiceAccount with the chart's RBAC (§10).

Tests and the demo run the operator as this ServiceAccount, bound to exactly the rules the
Helm chart grants (`charts/cozy-gpu-operator/files/rbac/`), so every integration test also
proves those rules are enough. `tenant_roles` are the chart's ClusterRoles for tenants.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from cozygpu.api import kinds
from cozygpu.api.names import DEV_NAMESPACE
from cozygpu.devcluster.binaries import repo_root
from cozygpu.kube.adapter import Body, Kube

if TYPE_CHECKING:  # only a type here: `cozygpu run --dev` loads no control plane
    from cozygpu.devcluster.controlplane import ControlPlane

NAMESPACE = DEV_NAMESPACE
NAME = "cozy-gpu-operator"
USERNAME = f"system:serviceaccount:{NAMESPACE}:{NAME}"
RBAC_DIR = repo_root() / "charts" / "cozy-gpu-operator" / "files" / "rbac"
RBAC = "rbac.authorization.k8s.io"

# `cozygpu run --dev` registers its own webhook configurations and policy; in a cluster the chart installs them.
DEV_RULES = [
    {
        "apiGroups": ["admissionregistration.k8s.io"],
        "resources": [
            "mutatingwebhookconfigurations",
            "validatingwebhookconfigurations",
            "validatingadmissionpolicies",
            "validatingadmissionpolicybindings",
        ],
        "verbs": ["get", "create", "update", "delete"],
    },
    # The API server lets only who may list the objects a binding's paramRef selects create it: the second no-bypass
    # policy selects the operator's mutating configurations by label (runtime.admission.policy.webhooks_binding).
    {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"], "verbs": ["list"]},
    # The API server lets only who may get every ConfigMap register a policy whose parameter is one (§12.3); the
    # chart's policy is installed by whoever installs the chart. Also the CA a dev control plane publishes (§14.1).
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
]


def _rules(file: str) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = yaml.safe_load((RBAC_DIR / file).read_text())["rules"]
    return rules


def operator_rules() -> list[dict[str, Any]]:
    return _rules("operator.yaml")


def metrics_reader_rules() -> list[dict[str, Any]]:
    return _rules("metrics-reader.yaml")


def leader_election_rules() -> list[dict[str, Any]]:
    return _rules("leader-election.yaml")


def tenant_roles() -> list[Body]:
    """The tenants' ClusterRoles, with the labels that aggregate them into admin, edit and view."""
    roles = yaml.safe_load((RBAC_DIR / "tenant.yaml").read_text())["roles"]
    return [
        _role("ClusterRole", r["name"], r["rules"], {f"{RBAC}/aggregate-to-{to}": "true" for to in r["aggregateTo"]})
        for r in roles
    ]


def _role(kind: str, name: str, rules: list[dict[str, Any]], labels: dict[str, str] | None = None) -> Body:
    """A ClusterRole, or a Role in the operator's namespace."""
    meta: dict[str, Any] = {"name": name, "labels": labels or {}}
    if kind == "Role":
        meta["namespace"] = NAMESPACE
    return {"apiVersion": f"{RBAC}/v1", "kind": kind, "metadata": meta, "rules": rules}


def _binding(role_kind: str, name: str) -> Body:
    """The ServiceAccount bound to the role of that kind and name (a RoleBinding for a Role)."""
    meta: dict[str, Any] = {"name": name}
    if role_kind == "Role":
        meta["namespace"] = NAMESPACE
    return {
        "apiVersion": f"{RBAC}/v1",
        "kind": f"{role_kind}Binding",
        "metadata": meta,
        "roleRef": {"apiGroup": RBAC, "kind": role_kind, "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}],
    }


def install(kube: Kube, *, dev: bool = True) -> None:
    """The namespace, the ServiceAccount, the operator's roles and bindings (and --dev's extra rule)."""
    kube.put_object(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    kube.put_object(
        kinds.kind("ServiceAccount"),
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, "namespace": NAMESPACE}},
    )
    roles = [("ClusterRole", NAME, operator_rules()), ("Role", f"{NAME}-leader-election", leader_election_rules())]
    if dev:
        roles.append(("ClusterRole", f"{NAME}-dev", DEV_RULES))
    for kind, name, rules in roles:
        kube.put_object(kinds.kind(kind), _role(kind, name, rules))
        kube.put_object(kinds.kind(f"{kind}Binding"), _binding(kind, name))
    for body in tenant_roles():
        kube.put_object(kinds.kind("ClusterRole"), body)


METRICS_READER = f"{NAME}-metrics-reader"


def metrics_token(kube: Kube) -> str:
    """A token of a scraper's ServiceAccount bound to the chart's metrics-reader ClusterRole, as Prometheus is."""
    install(kube)
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": METRICS_READER, "namespace": NAMESPACE},
    }
    kube.put_object(kinds.kind("ServiceAccount"), account)
    kube.put_object(kinds.kind("ClusterRole"), _role("ClusterRole", METRICS_READER, metrics_reader_rules()))
    binding = _binding("ClusterRole", METRICS_READER)
    binding["subjects"][0]["name"] = METRICS_READER
    kube.put_object(kinds.kind("ClusterRoleBinding"), binding)
    return kube.request_token(NAMESPACE, METRICS_READER)


def write_kubeconfig(plane: ControlPlane, path: Path) -> Path:
    """Install the identity and write a kubeconfig that authenticates as the ServiceAccount."""
    kube = plane.kube()
    install(kube)
    return plane.write_token_kubeconfig(path, USERNAME, kube.request_token(NAMESPACE, NAME), namespace=NAMESPACE)


def own_identity(admin_kubeconfig: Path, directory: Path) -> tuple[Path, str]:
    """§12.4 for `cozygpu run --dev`: a kubeconfig for the operator's own ServiceAccount (installed with the
    chart's RBAC by the given credentials), and the user those credentials are. A kubeconfig that already is a
    ServiceAccount's is returned as it is: then the operator is that account, as in a cluster."""
    kube = Kube.from_kubeconfig(admin_kubeconfig)
    user = kube.whoami()
    if user.startswith("system:serviceaccount:"):
        return admin_kubeconfig, user
    config = yaml.safe_load(admin_kubeconfig.read_text())
    context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
    install(kube)
    token = kube.request_token(NAMESPACE, NAME)
    credentials = {"token": token}
    own = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": cluster}],
        "users": [{"name": USERNAME, "user": credentials}],
        "contexts": [{"name": "operator", "context": {"cluster": "cluster", "user": USERNAME, "namespace": NAMESPACE}}],
        "current-context": "operator",
    }
    path = directory / "operator-kubeconfig"
    path.write_text(yaml.safe_dump(own))
    path.chmod(0o600)
    return path, user
