"""The webhook envelope (§3, issue 12): what is no AdmissionReview request we can answer, and which field says so."""

from __future__ import annotations

from typing import Any

import pytest

from cozygpu.runtime.admission.webhooks import envelope_problem


def review(**request: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "uid": "u-1",
        "resource": {"group": "kubevirt.io", "version": "v1", "resource": "virtualmachineinstances"},
        "userInfo": {"username": "alice"},
        "object": {"metadata": {"name": "vm"}},
        "oldObject": None,
        "dryRun": False,
    }
    base.update(request)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": base}


def test_a_well_formed_review_has_no_problem() -> None:
    """A review as the API server sends it passes, dryRun absent or a boolean, oldObject null."""
    assert envelope_problem(review()) is None
    assert envelope_problem(review(dryRun=True, oldObject={"metadata": {}})) is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "no request object"),
        ({"request": 3}, "no request object"),
        (review(uid=""), "request.uid"),
        (review(uid=7), "request.uid"),
        (review(resource="vmis"), "request.resource"),
        (review(userInfo=None), "request.userInfo"),
        (review(dryRun="yes"), "request.dryRun"),
        (review(object="a string"), "request.object"),
        (review(object={"metadata": []}), "request.object.metadata"),
        (review(oldObject=[1]), "request.oldObject"),
        # Found by the fuzz (tests/reliability): kopf reads these and answered 500.
        (review(resource={}), "request.resource.group"),
        (review(resource={"group": "", "version": 1, "resource": "x"}), "request.resource.version"),
        (review(operation=["CREATE"]), "request.operation"),
        (review(subResource={}), "request.subResource"),
        (review(object=None), "request.object and request.oldObject are both missing"),
    ],
)
def test_each_malformed_part_is_named(body: Any, field: str) -> None:
    """Each wrongly typed or missing part of the envelope is refused with its field's name (a 400)."""
    problem = envelope_problem(body)
    assert problem is not None and field in problem


@pytest.mark.parametrize(
    ("request_namespace", "objects", "field"),
    [
        ("tenant-a", {"object": {"metadata": {"name": "vm", "namespace": "tenant-b"}}}, "request.object"),
        ("tenant-a", {"object": {"metadata": {"name": "vm"}}}, "request.object"),
        (None, {"object": {"metadata": {"name": "vm", "namespace": "tenant-b"}}}, "request.object"),
        ("tenant-a", {"object": None, "oldObject": {"metadata": {"namespace": "tenant-b"}}}, "request.oldObject"),
    ],
)
def test_a_review_whose_namespaces_disagree_is_refused(
    request_namespace: str | None, objects: dict[str, Any], field: str
) -> None:
    """§14.1: the API server sets the object's namespace from the request's; a review whose two differ was not
    sent by it, and nothing may be done in the namespace only the object names."""
    problem = envelope_problem(review(namespace=request_namespace, **objects))
    assert problem == f"{field}.metadata.namespace is not request.namespace"


def test_a_review_whose_namespaces_agree_passes() -> None:
    """A namespaced object in its request's namespace, and a cluster-scoped one with none, pass."""
    assert envelope_problem(review(namespace="t", object={"metadata": {"name": "vm", "namespace": "t"}})) is None
    assert envelope_problem(review(object={"metadata": {"name": "c"}}, oldObject={"metadata": {"name": "c"}})) is None
