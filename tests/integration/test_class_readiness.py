"""A GPUClass is Ready only once the API server guards its resource (§12.3, issue 34 item 6).

The API server enforces a resource added to the no-bypass policy's parameter once its own copy has caught up; a
plain pod admitted before that, or before the class existed, may hold units the binder would count as free. The
scenarios hold the gap open by freezing the parameter (a policy of the test's own refuses its writes), which is the
API server's lag made as long as a test needs: nothing of the class's may take new units until the parameter has
its resource, the operator has seen the API server refuse its probe, and the pods admitted meanwhile are known.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from cozygpu.api import kinds
from cozygpu.api.names import CONDITION_READY
from cozygpu.kube.adapter import ApiError, Body, Kube
from cozygpu.runtime.admission import policy
from tests.support.bodies import gpu_class_body, gpu_device_body
from tests.support.harness import OperatorProcess, wait_for
from tests.support.nodes import GPUNodeFactory, fresh_gpu

FREEZE = "test-freezes-the-managed-resources"


@contextmanager
def unguarded(kube: Kube) -> Iterator[None]:
    """For the block, the API server's copy of the policy's parameter stays as it was: a policy of the test's own
    refuses every write of it, so a class created meanwhile has a resource the API server does not guard. The
    block starts once a write is refused (the API server takes a policy up a moment after its creation)."""
    frozen = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": FREEZE},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{**policy.CONFIGMAPS_CREATE, "operations": ["CREATE", "UPDATE"]}]},
            "validations": [
                {"expression": f"object.metadata.name != '{policy.MANAGED_RESOURCES}'", "message": "frozen by a test"}
            ],
        },
    }
    kube.create(kinds.POLICY, frozen)
    kube.create(
        kinds.POLICY_BINDING,
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": FREEZE},
            "spec": {"policyName": FREEZE, "validationActions": ["Deny"]},
        },
    )
    namespace = kube.get(kinds.POLICY_BINDING, policy.NAME)["spec"]["paramRef"]["namespace"]

    def refused() -> bool:
        parameter = kube.get(kinds.kind("ConfigMap"), policy.MANAGED_RESOURCES, namespace)
        try:
            kube.replace(kinds.kind("ConfigMap"), parameter, dry_run=True)
        except ApiError as e:
            return FREEZE in e.message
        return False

    try:
        wait_for("the parameter frozen", refused)
        yield
    finally:
        kube.delete(kinds.POLICY_BINDING, FREEZE)
        kube.delete(kinds.POLICY, FREEZE)


def ready_of(kube: Kube, name: str) -> dict[str, Any] | None:
    conditions = (kube.get(kinds.GPU_CLASS, name).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == CONDITION_READY), None)


def plain_pod(name: str, namespace: str, resource: str, **spec: Any) -> Body:
    asks = {resource: "1"}
    container = {"name": "c", "image": "registry.invalid/x", "resources": {"requests": asks, "limits": asks}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [container], **spec},
    }


def device_status(kube: Kube, name: str, namespace: str) -> dict[str, Any]:
    return kube.get(kinds.GPU_DEVICE, name, namespace).get("status") or {}


def test_a_held_device_waits_until_the_api_server_guards_its_class(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu_node: GPUNodeFactory
) -> None:
    """While the API server does not refuse plain pods asking for the class's resource, the class says so and its
    held device waits with the reason; once it does, the class is Ready and the device Bound. Before, the device
    was Bound at once, on units a plain pod admitted meanwhile could take as well."""
    gpu = fresh_gpu()
    gpu_node({gpu.resource: 2})
    try:
        with unguarded(kube):
            kube.create(kinds.GPU_CLASS, gpu_class_body(gpu.cls, gpu.resource))
            kube.create(kinds.GPU_DEVICE, gpu_device_body("held", namespace, gpu.cls))
            waiting = wait_for(
                "held waiting for its class",
                lambda: (
                    (s := device_status(kube, "held", namespace)).get("message", "").find("not ready yet") >= 0 and s
                ),
            )
            assert waiting.get("phase") == "Pending" and not waiting.get("nodeName")
            assert gpu.resource in waiting["message"]
            # The binder says why at once; the guard writes the class's condition once its first probe is allowed.
            condition = wait_for("the class not ready", lambda: ready_of(kube, gpu.cls))
            assert (condition["status"], condition["reason"]) == ("False", "AwaitingGuard")
        wait_for("the class Ready", lambda: (c := ready_of(kube, gpu.cls)) is not None and c["status"] == "True")
        assert ready_of(kube, gpu.cls)["reason"] == "Guarded"  # type: ignore[index]
        wait_for("held bound", lambda: device_status(kube, "held", namespace).get("phase") == "Bound")
    finally:
        kube.delete(kinds.GPU_DEVICE, "held", namespace)
        wait_for("held gone", lambda: kube.get_or_none(kinds.GPU_DEVICE, "held", namespace) is None)
        kube.delete(kinds.GPU_CLASS, gpu.cls)


def test_pods_admitted_before_the_guard_keep_their_units_from_the_binder(
    admitting: OperatorProcess, kube: Kube, namespace: str, gpu_node: GPUNodeFactory
) -> None:
    """A plain pod admitted while the resource was unguarded, on the node's one unit, is counted before the class
    is Ready, so the held device waits for a free unit instead of being Bound on that one; a pod admitted then and
    not yet scheduled keeps the class waiting, named in its condition, until it is gone."""
    gpu = fresh_gpu()
    node = gpu_node({gpu.resource: 1})["metadata"]["name"]
    try:
        with unguarded(kube):
            kube.create(kinds.GPU_CLASS, gpu_class_body(gpu.cls, gpu.resource))
            kube.create(kinds.POD, plain_pod("early", namespace, gpu.resource, nodeName=node))
            kube.create(kinds.POD, plain_pod("unplaced", namespace, gpu.resource, nodeSelector={"nowhere": "x"}))
            kube.create(kinds.GPU_DEVICE, gpu_device_body("held", namespace, gpu.cls))
        waiting = wait_for(
            "the class waiting for the unplaced pod",
            lambda: (c := ready_of(kube, gpu.cls)) is not None and c["reason"] == "AwaitingPods" and c,
        )
        assert f"{namespace}/unplaced" in waiting["message"] and waiting["status"] == "False"
        assert device_status(kube, "held", namespace).get("phase") != "Bound"
        kube.delete(kinds.POD, "unplaced", namespace)
        wait_for("the class Ready", lambda: (c := ready_of(kube, gpu.cls)) is not None and c["status"] == "True")
        status = wait_for(
            "held waiting for a free unit",
            lambda: "free unit" in (s := device_status(kube, "held", namespace)).get("message", "") and s,
        )
        assert status.get("phase") == "Pending" and not status.get("nodeName")
    finally:
        for pod in ("early", "unplaced"):
            kube.delete(kinds.POD, pod, namespace)
        kube.delete(kinds.GPU_DEVICE, "held", namespace)
        wait_for("held gone", lambda: kube.get_or_none(kinds.GPU_DEVICE, "held", namespace) is None)
        kube.delete(kinds.GPU_CLASS, gpu.cls)


def test_the_probe_is_what_the_policy_refuses_and_nothing_else(admitting: OperatorProcess, kube: Kube) -> None:
    """The probe is refused for a managed resource only: an unmanaged one, or an ordinary ConfigMap naming a
    managed one, is created as any other (the policy looks at ConfigMaps with the probe's label alone)."""
    gpu = fresh_gpu()
    kube.create(kinds.GPU_CLASS, gpu_class_body(gpu.cls, gpu.resource))
    try:
        wait_for("the class Ready", lambda: (c := ready_of(kube, gpu.cls)) is not None and c["status"] == "True")
        namespace = kube.get(kinds.POLICY_BINDING, policy.NAME)["spec"]["paramRef"]["namespace"]
        refusal = ""
        try:
            kube.create(kinds.kind("ConfigMap"), policy.probe(namespace, gpu.resource), dry_run=True)
        except Exception as e:  # the API server's refusal, as the guard reads it
            refusal = str(e)
        assert policy.NAME in refusal and policy.PROBE_GUARDED in refusal
        kube.create(kinds.kind("ConfigMap"), policy.probe(namespace, "example.com/unmanaged"), dry_run=True)
        plain = policy.probe(namespace, gpu.resource)
        del plain["metadata"]["labels"]
        kube.create(kinds.kind("ConfigMap"), plain, dry_run=True)
    finally:
        kube.delete(kinds.GPU_CLASS, gpu.cls)
