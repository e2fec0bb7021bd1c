"""Fuzzed admission reviews straight to the running webhook server (issue 12 items 3 and 4).

Hypothesis spoils well-formed reviews for every hook (any field replaced by any JSON value,
or the whole body) and writes arbitrary device-reference annotations into VMIs. Whatever
arrives, the answer is a 200 with a well-formed response for that uid, or a 400: never a
500, never a dropped connection, and the operator stays alive and ready. `make soak` runs
100,000 examples; `make test` a few hundred.
"""

from __future__ import annotations

import base64
import json
import os
import uuid
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cozygpu.api import hooks, kinds
from cozygpu.api.names import ANNOTATION_DEVICES, LABEL_DEVICE_REFERENCE
from cozygpu.kube.adapter import Kube
from cozygpu.runtime.admission import webhooks
from tests.support.bodies import vmi_body
from tests.support.harness import OperatorProcess
from tests.support.soak import TALLY, runs

pytestmark = pytest.mark.integration

# Per test: two tests, 100,000 in the soak; COZYGPU_FUZZ_EXAMPLES overrides either.
EXAMPLES = int(os.environ.get("COZYGPU_FUZZ_EXAMPLES", runs(150, 50_000)))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
HOOK_KINDS = {hook.id: (hook.kind.group, hook.kind.version, hook.kind.kind, hook.kind.plural) for hook in hooks.HOOKS}
FIELDS = [
    (),
    ("request",),
    ("request", "uid"),
    ("request", "dryRun"),
    ("request", "operation"),
    ("request", "object"),
    ("request", "oldObject"),
    ("request", "userInfo"),
    ("request", "kind"),
    ("request", "resource"),
    ("request", "namespace"),
    ("request", "object", "metadata"),
    ("request", "object", "spec"),
    ("request", "object", "metadata", "labels"),
    ("request", "object", "metadata", "annotations"),
    ("request", "object", "spec", "domain"),
    ("request", "userInfo", "groups"),
]


@pytest.fixture(scope="module")
def endpoint(
    admitting: OperatorProcess, kube: Kube, api_server_cert: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, str, Any]:
    """The webhook server's base URL and CA file, from the configuration the operator registered, and the client
    certificate the API server presents (§14.1)."""
    client = kube.get(kinds.MUTATING_WEBHOOKS, webhooks.MUTATING_NAME)["webhooks"][0]["clientConfig"]
    ca = tmp_path_factory.mktemp("serving-ca") / "ca.crt"  # pytest's own directory: nothing left in /tmp
    ca.write_bytes(base64.b64decode(client["caBundle"]))
    return client["url"].rsplit("/", 1)[0], str(ca), api_server_cert


def review(hook: str, obj: dict[str, Any], dry_run: bool = True) -> dict[str, Any]:
    group, version, kind, resource = HOOK_KINDS[hook]
    gvk, gvr = (
        {"group": group, "version": version, "kind": kind},
        {"group": group, "version": version, "resource": resource},
    )
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": obj["metadata"].get("name"),
            "namespace": "fuzz",
            "operation": "CREATE",
            "userInfo": {"username": "tenant", "groups": ["system:authenticated"]},
            "object": obj,
            "oldObject": None,
            "dryRun": dry_run,
        },
    }


def _object(hook: str) -> dict[str, Any]:
    if hook == webhooks.VMI_HOOK:
        return vmi_body("vm", "fuzz", [{"deviceTemplate": {"className": "none", "count": 1}}])
    kind = HOOK_KINDS[hook][2]
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": "x", "namespace": "fuzz"}, "spec": {}}


def _replace(body: Any, path: tuple[str, ...], value: Any) -> Any:
    if not path:
        return value
    node = body
    for key in path[:-1]:
        if not isinstance(node, dict):
            return body
        node = node.setdefault(key, {})
    if isinstance(node, dict):
        node[path[-1]] = value
    return body


def _judge(base: str, ca: str, cert: Any, hook: str, body: Any, record: str) -> None:
    answer = requests.post(
        f"{base}/{hook}",
        data=json.dumps(body),
        verify=ca,
        cert=cert,
        timeout=30,
        headers={"Content-Type": "application/json"},
    )
    TALLY[record].runs += 1
    assert answer.status_code in (200, 400), f"{answer.status_code} {answer.reason} for {json.dumps(body)[:400]}"
    if answer.status_code == 200:
        response = answer.json()["response"]
        assert response["uid"] == body["request"]["uid"] and isinstance(response["allowed"], bool)


@pytest.mark.timeout(0)  # the soak's 50,000 examples take longer than the default 300 s
@FUZZ
@given(hook=st.sampled_from(sorted(HOOK_KINDS)), path=st.sampled_from(FIELDS), value=JSON)
def test_a_review_spoilt_anywhere_is_answered_200_or_400_never_500(
    endpoint: tuple[str, str, Any], hook: str, path: tuple[str, ...], value: Any
) -> None:
    """Any field of a review (or the whole body) replaced by any JSON value: a 400, or a well-formed answer."""
    _judge(*endpoint, hook, _replace(review(hook, _object(hook)), path, value), "fuzzed envelopes")


REF = (
    st.fixed_dictionaries(
        {},
        optional={
            "device": JSON | st.text(max_size=12),
            "deviceTemplate": st.fixed_dictionaries(
                {}, optional={"className": JSON | st.just("none"), "count": JSON | st.integers(-2, 70)}
            )
            | JSON,
        },
    )
    | JSON
)
ANNOTATION = st.text(max_size=60) | st.builds(json.dumps, JSON) | st.builds(json.dumps, st.lists(REF, max_size=70))


@pytest.mark.timeout(0)
@FUZZ
@given(annotation=ANNOTATION, dry_run=st.booleans())
def test_any_device_annotation_is_refused_or_admitted_never_a_500(
    endpoint: tuple[str, str, Any], annotation: str, dry_run: bool
) -> None:
    """A VMI with the device-reference label and any annotation text: a denial naming what is wrong or an
    answer, never a 500 (the names exist nowhere, so nothing is written)."""
    vmi = vmi_body("vm", "fuzz", None)
    vmi["metadata"]["labels"] = {LABEL_DEVICE_REFERENCE: "true"}
    vmi["metadata"]["annotations"] = {ANNOTATION_DEVICES: annotation}
    _judge(*endpoint, webhooks.VMI_HOOK, review(webhooks.VMI_HOOK, vmi, dry_run), "fuzzed annotations")


def test_the_operator_outlived_the_fuzz(admitting: OperatorProcess) -> None:
    """After every example above: still healthy and ready, nothing restarted."""
    assert admitting.healthy() and admitting.ready()
    assert admitting.events("task.failed") == [] and admitting.events("task.died") == []
