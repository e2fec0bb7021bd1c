"""Hostile tenants as the platform makes tenants (§14, issue 19): a ServiceAccount in a namespace of its own,
holding the namespace's `edit` role (pods, services, secrets...: what a real tenant has, issue 34), the chart's
tenant role and the VMI rights KubeVirt's `kubevirt.io:edit` grants."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

from cozygpu.api import kinds
from cozygpu.devcluster import identity
from cozygpu.devcluster.controlplane import ControlPlane
from cozygpu.kube.adapter import Kube

RBAC = "rbac.authorization.k8s.io"
# The rule of KubeVirt's `kubevirt.io:edit` ClusterRole on VMs and VMIs (kv-dump -what=rbac), for the control
# plane without KubeVirt, where that role is not installed.
KUBEVIRT_EDIT_VMIS = {
    "apiGroups": ["kubevirt.io"],
    "resources": ["virtualmachines", "virtualmachineinstances"],
    "verbs": ["get", "delete", "create", "update", "patch", "list", "watch"],
}


@dataclass(frozen=True)
class Tenant:
    """A tenant as the platform makes one: a ServiceAccount with the namespace roles, and its own client."""

    name: str
    namespace: str
    kube: Kube
    token: str
    kubeconfig: Path  # for a client of its own per thread

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}"


def make_tenant(plane: ControlPlane, admin: Kube, name: str, directory: Path) -> Tenant:
    """A fresh namespace and a ServiceAccount `name` there, bound to the built-in `edit` ClusterRole, to
    cozy-gpu-tenant-edit and to KubeVirt's kubevirt.io:edit (where KubeVirt runs; otherwise a Role with that role's
    VM and VMI rule). `edit` is an aggregated role, and no aggregation controller runs here: what it would aggregate
    (`system:aggregate-to-edit`, the chart's tenant role) is bound as well."""
    identity.install(admin)  # the chart's tenant ClusterRoles
    namespace = f"{name}-{uuid.uuid4().hex[:6]}"
    admin.create(kinds.NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    admin.create(
        kinds.kind("ServiceAccount"),
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}},
    )
    vmis = ("ClusterRole", "kubevirt.io:edit")
    if admin.get_or_none(kinds.kind("ClusterRole"), "kubevirt.io:edit") is None:
        vmis = ("Role", "kubevirt-edit-vmis")
        admin.create(
            kinds.kind("Role"),
            {
                "apiVersion": f"{RBAC}/v1",
                "kind": "Role",
                "metadata": {"name": vmis[1], "namespace": namespace},
                "rules": [KUBEVIRT_EDIT_VMIS],
            },
        )
    edit = [("ClusterRole", r) for r in ("edit", "system:aggregate-to-edit", "cozy-gpu-tenant-edit")]
    for kind, role in (*edit, vmis):
        admin.create(
            kinds.kind("RoleBinding"),
            {
                "apiVersion": f"{RBAC}/v1",
                "kind": "RoleBinding",
                "metadata": {"name": role.replace(":", "-"), "namespace": namespace},
                "roleRef": {"apiGroup": RBAC, "kind": kind, "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
            },
        )
    token = admin.request_token(namespace, name)
    user = f"system:serviceaccount:{namespace}:{name}"
    config = plane.write_token_kubeconfig(directory / f"{namespace}.kubeconfig", user, token, namespace=namespace)
    return Tenant(name, namespace, Kube.from_kubeconfig(config), token, config)
