"""The CRDs under crds/ are generated from the models and say what §1 says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from cozygpu.api import KINDS, crdgen
from cozygpu.cli import CRD_DIRS
from cozygpu.runtime.admission import chart, policy

REPO = Path(__file__).resolve().parents[2]


def _crd(kind: str) -> dict[str, Any]:
    return next(crdgen.crd(k) for k in KINDS if k.crd.kind == kind)


def _schema(kind: str) -> dict[str, Any]:
    schema: dict[str, Any] = _crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


@pytest.mark.parametrize("directory", CRD_DIRS)
def test_checked_in_crds_match_the_models(directory: str) -> None:
    """`make crds` output is what is checked in, in crds/ and in the chart's crds/ (issue 23 item 1); a model change
    without it fails here."""
    rendered = crdgen.rendered()
    on_disk = {p.name: p.read_text() for p in (REPO / directory).glob("*.yaml")}
    assert set(on_disk) == set(rendered), f"{directory} holds other files than the models generate"
    stale = [name for name, text in rendered.items() if on_disk[name] != text]
    assert not stale, f"run `make crds`: {stale} differ from the models"


def crds(*args: str) -> subprocess.CompletedProcess[str]:
    """`cozygpu crds` in a process of its own (the CLI configures logging for its process)."""
    return subprocess.run(
        [sys.executable, "-m", "cozygpu.cli", "crds", *args], capture_output=True, text=True, check=False
    )


def test_the_crds_check_fails_on_drift_in_either_copy(tmp_path: Path) -> None:
    """`cozygpu crds` writes every directory; `--check` (make lint) names a changed or foreign file in any of them."""
    top, chart = tmp_path / "crds", tmp_path / "chart-crds"
    dirs = ("--dir", str(top), "--dir", str(chart))
    assert crds(*dirs).returncode == 0
    assert crds(*dirs, "--check").returncode == 0
    name = next(iter(crdgen.rendered()))
    (chart / name).write_text((chart / name).read_text() + "# edited by hand\n")
    (chart / "gpu.cozystack.io_gone.yaml").write_text("{}\n")
    done = crds(*dirs, "--check")
    assert done.returncode == 1
    [line] = done.stdout.splitlines()
    assert str(chart) in line and name in line and "gpu.cozystack.io_gone.yaml (not generated)" in line
    assert str(top) not in line.replace(str(chart), "")


def _walk(node: Any, path: str = "") -> list[str]:
    """Places that break structural-schema rules."""
    bad = []
    if isinstance(node, dict):
        for banned in ("$ref", "anyOf", "allOf", "oneOf", "$defs", "title", "default"):
            if banned in node:
                bad.append(f"{path}: {banned}")
        if ("properties" in node or "items" in node or "additionalProperties" in node) and "type" not in node:
            bad.append(f"{path}: no type")
        for key in ("properties",):
            for name, child in node.get(key, {}).items():
                if "type" not in child:
                    bad.append(f"{path}.{name}: no type")
                bad += _walk(child, f"{path}.{name}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                bad += _walk(node[key], f"{path}[{key}]")
    return bad


@pytest.mark.parametrize("kind", [k.crd.kind for k in KINDS])
def test_schemas_are_structural(kind: str) -> None:
    """Every node has a type; no references, unions, titles or defaults survive."""
    assert _walk(_schema(kind)) == []


@pytest.mark.parametrize("kind", [k.crd.kind for k in KINDS])
def test_every_kind_has_a_status_subresource(kind: str) -> None:
    """Status is written through /status only, so RBAC can keep tenants off it (§9.1)."""
    assert _crd(kind)["spec"]["versions"][0]["subresources"] == {"status": {}}


def test_scopes_follow_section_1() -> None:
    """§1: GPUClass and GPUNode are cluster-scoped; GPUDevice and GPUBudget namespaced."""
    scopes = {k.crd.kind: _crd(k.crd.kind)["spec"]["scope"] for k in KINDS}
    assert scopes == {"GPUClass": "Cluster", "GPUNode": "Cluster", "GPUDevice": "Namespaced", "GPUBudget": "Namespaced"}


def test_device_count_minimum_and_required_fields() -> None:
    """§1.2: className and count are required, count >= 1."""
    spec = _schema("GPUDevice")["properties"]["spec"]
    assert sorted(spec["required"]) == ["className", "count"]
    assert spec["properties"]["count"]["minimum"] == 1
    assert _schema("GPUDevice")["required"] == ["spec"]


@pytest.mark.parametrize("field", ["className", "count"])
def test_device_spec_fields_are_immutable_by_cel(field: str) -> None:
    """§1.2: both spec fields are immutable, enforced by an x-kubernetes-validations rule."""
    rules = _schema("GPUDevice")["properties"]["spec"]["properties"][field]["x-kubernetes-validations"]
    assert rules == [{"rule": "self == oldSelf", "message": f"spec.{field} is immutable"}]


def test_class_mode_enum_and_required_fields() -> None:
    """§1.1: mode and resourceName are required; mode is passthrough or vgpu."""
    spec = _schema("GPUClass")["properties"]["spec"]
    assert sorted(spec["required"]) == ["mode", "resourceName"]
    assert spec["properties"]["mode"]["enum"] == ["passthrough", "vgpu"]
    assert spec["properties"]["maxCount"]["minimum"] == 1


def test_device_phase_enum() -> None:
    """§1.2: the phases are Pending, Bound, Lost (unset before the operator sees it)."""
    phase = _schema("GPUDevice")["properties"]["status"]["properties"]["phase"]
    assert phase["enum"] == ["Pending", "Bound", "Lost"]


def test_budget_limits_are_a_map_of_non_negative_integers() -> None:
    """§1.4/§9.3: limits maps class names to non-negative units."""
    limits = _schema("GPUBudget")["properties"]["spec"]["properties"]["limits"]
    assert limits["type"] == "object"
    assert limits["additionalProperties"] == {"type": "integer", "minimum": 0}


def _columns(kind: str) -> dict[str, str]:
    columns = _crd(kind)["spec"]["versions"][0]["additionalPrinterColumns"]
    return {c["name"]: c["jsonPath"] for c in columns}


def test_device_printer_columns() -> None:
    """§1.2: class, count, phase, node, VMI, age."""
    assert _columns("GPUDevice") == {
        "Class": ".spec.className",
        "Count": ".spec.count",
        "Phase": ".status.phase",
        "Node": ".status.nodeName",
        "VMI": ".status.attachedTo.vmi",
        "Age": ".metadata.creationTimestamp",
    }


def test_node_printer_columns() -> None:
    """§1.3: resources held/allocatable, LostCapacity, age."""
    columns = _columns("GPUNode")
    assert columns["Held/Allocatable"] == ".status.summary"
    assert columns["LostCapacity"] == '.status.conditions[?(@.type=="LostCapacity")].status'
    assert columns["Age"] == ".metadata.creationTimestamp"


# Short names a KubeVirt cluster already uses (core, apps, KubeVirt, CDI, common add-ons).
TAKEN = {
    "cs",
    "cm",
    "ep",
    "ev",
    "limits",
    "ns",
    "no",
    "pvc",
    "pv",
    "po",
    "rc",
    "quota",
    "sa",
    "svc",
    "crd",
    "crds",
    "ds",
    "deploy",
    "rs",
    "sts",
    "hpa",
    "cj",
    "csr",
    "netpol",
    "pdb",
    "psp",
    "pc",
    "sc",
    "vmi",
    "vmis",
    "vm",
    "vms",
    "kv",
    "kvs",
    "vmim",
    "vmims",
    "vmpreset",
    "vmipreset",
    "vmirs",
    "vmrs",
    "dv",
    "dvs",
    "cdi",
    "vmsnapshot",
    "vmrestore",
    "vmexport",
    "vmclone",
    "vmpool",
    "vmf",
    "vminstancetype",
    "vmclusterinstancetype",
    "vmpref",
    "vmcpref",
    "migpol",
    "gpu",
    "gpus",
    "gc",
    "gcl",
    "node",
    "cert",
    "certs",
    "ing",
}


def test_short_names_clash_with_nothing_common() -> None:
    """Our short names are unique among themselves and unused by Kubernetes or KubeVirt."""
    short = [s for k in KINDS for s in k.crd.short_names]
    assert len(short) == len(set(short))
    assert not set(short) & TAKEN


def test_kubevirt_fixture_is_the_real_schema() -> None:
    """The test fixture holds KubeVirt's full CRD set, from a named commit, with a gpus schema under
    spec.domain.devices."""
    text = (REPO / "tests/fixtures/kubevirt/crds.yaml").read_text()
    assert "from KubeVirt commit d923fdb815cd2016ddaebdaaa51db04133576d72" in text.split("---", 1)[0]
    docs = [d for d in yaml.load_all(text, Loader=yaml.CSafeLoader) if d]
    names = {d["metadata"]["name"] for d in docs}
    kinds_we_run = {"virtualmachineinstances", "virtualmachines", "kubevirts", "virtualmachineinstancemigrations"}
    assert {f"{plural}.kubevirt.io" for plural in kinds_we_run} <= names
    assert len(names) == 20
    vmi = next(d for d in docs if d["spec"]["names"]["kind"] == "VirtualMachineInstance")
    schema = vmi["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    gpus = schema["properties"]["spec"]["properties"]["domain"]["properties"]["devices"]["properties"]["gpus"]
    assert "name" in gpus["items"]["required"]
    assert "deviceName" in gpus["items"]["properties"]


def test_the_charts_policy_file_is_the_codes() -> None:
    """§12.3: the chart's no-bypass-policy.yaml is what runtime.admission.policy builds (run `make chart-files`)."""
    path = REPO / "charts" / "cozy-gpu-operator" / "files" / policy.CHART_FILE
    assert path.read_text() == policy.chart_file(), "run `make chart-files`"


def test_the_charts_webhooks_file_is_the_codes() -> None:
    """§3, §12: the chart's webhooks.json is what runtime.admission.chart builds from the operator's own
    configurations (run `make chart-files`); test_chart renders it and compares with them."""
    path = REPO / "charts" / "cozy-gpu-operator" / "files" / chart.CHART_FILE
    assert path.read_text() == chart.chart_file(), "run `make chart-files`"
