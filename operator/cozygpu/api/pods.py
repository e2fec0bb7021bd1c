"""What a Pod asks for and whose launcher it is, read from its plain body (§12).

One place for these rules: the pod webhook's decision (`decisions.launchers`, §12.2)
and the view's index of the units pods hold on nodes (`state.pods`, §1.3) both read a
pod through them. A pod holds, of each extended resource, what kube-scheduler counts:
the sum over its containers, or its largest init container's ask if that is more.
"""

from __future__ import annotations

import re
from collections.abc import Container, Mapping
from typing import Any

from cozygpu.api.names import KUBEVIRT_DEVICES, KUBEVIRT_GROUP, LABEL_KUBEVIRT

_QUANTITY = re.compile(r"^([0-9]+)(k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_SUFFIX: dict[str | None, int] = {
    None: 1,
    **{s: 1000**i for i, s in enumerate("kMGTPE", 1)},
    **{f"{s}i": 1024**i for i, s in enumerate("KMGTPE", 1)},
}
# Resources of Kubernetes' own namespace (kubernetes.io/..., *.kubernetes.io/...) are not extended.
_NATIVE = "kubernetes.io/"


class BadQuantity(ValueError):
    pass


def units(quantity: Any) -> int:
    """A whole count of an extended resource ("2", "1k"); the API server allows nothing else."""
    match = _QUANTITY.match(str(quantity).strip())
    if match is None:
        raise BadQuantity(f"{quantity!r} is not a whole number of units")
    count: int = int(match.group(1)) * _SUFFIX[match.group(2)]
    return count


def is_extended(resource: str) -> bool:
    """An extended resource a device plugin may serve (a GPU, say): a prefixed name outside Kubernetes'
    own namespace, and not one of KubeVirt's own devices, which every launcher pod asks for."""
    return "/" in resource and _NATIVE not in resource and not resource.startswith(KUBEVIRT_DEVICES)


class _Extended:
    def __contains__(self, resource: object) -> bool:
        return isinstance(resource, str) and is_extended(resource)


# Every extended resource, as a container for `asked`: `asked(pod, EXTENDED)`.
EXTENDED: Container[str] = _Extended()


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _container_asks(container: Any, resources: Container[str], lenient: bool) -> dict[str, int]:
    asks = _dict(_dict(container).get("resources"))
    out: dict[str, int] = {}
    for field in ("requests", "limits"):
        for resource, quantity in _dict(asks.get(field)).items():
            if resource not in resources:
                continue
            try:
                n = units(quantity)
            except BadQuantity:
                if not lenient:
                    raise
                continue  # counts as not asked
            out[resource] = max(out.get(resource, 0), n)
    return out


def asked(pod: Mapping[str, Any], resources: Container[str], *, lenient: bool = False) -> dict[str, int]:
    """Units of each of `resources` the pod holds while it runs, as the scheduler counts them: the sum
    over its containers, or the largest init container's ask if that is more. A quantity that is not a
    whole number raises BadQuantity, or with `lenient` counts as not asked; odd shapes ask for nothing."""
    spec = _dict(pod.get("spec"))
    total: dict[str, int] = {}
    for container in _list(spec.get("containers")):
        for resource, n in _container_asks(container, resources, lenient).items():
            total[resource] = total.get(resource, 0) + n
    for container in _list(spec.get("initContainers")):
        for resource, n in _container_asks(container, resources, lenient).items():
            total[resource] = max(total.get(resource, 0), n)
    return {r: n for r, n in total.items() if n}


def owner_vmi(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, uid) of the VMI that controls the pod, as virt-controller sets it on launcher pods."""
    for ref in map(_dict, _list(_dict(pod.get("metadata")).get("ownerReferences"))):
        if (
            ref.get("kind") == "VirtualMachineInstance"
            and str(ref.get("apiVersion", "")).startswith(f"{KUBEVIRT_GROUP}/")
            and ref.get("controller")
        ):
            return str(ref.get("name", "")), str(ref.get("uid", ""))
    return None


def launcher_of(pod: Mapping[str, Any]) -> str | None:
    """The name of the VMI whose launcher the pod is: the VMI as its controller, as KubeVirt itself tells its pods,
    whatever the `kubevirt.io` label says (a tenant may relabel its own pods; the guest runs on)."""
    owner = owner_vmi(pod)
    return owner[0] if owner and owner[0] else None


def watched(pod: Mapping[str, Any]) -> bool:
    """Whether the launcher informer's selection (the `kubevirt.io` label, any value) covers the pod."""
    return LABEL_KUBEVIRT in _dict(_dict(pod.get("metadata")).get("labels"))
