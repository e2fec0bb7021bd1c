"""What the view reads of a VMI's devices annotation, and how often (issue 34 item 2): every replica hears every
VMI event, so a tenant patching a fat VMI must cost a parse only where the annotation is ours and has changed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cozygpu.api import kinds, references
from cozygpu.api.names import ANNOTATION_DEVICES, LABEL_DEVICE_REFERENCE, TRUE
from cozygpu.runtime.view import View
from tests.support.views import cluster

Body = dict[str, Any]


def _vmi(refs: list[Body], version: int, *, labelled: bool = True, uid: str = "u1", **extra: str) -> Body:
    annotations = {ANNOTATION_DEVICES: json.dumps(refs), **extra}
    meta: Body = {
        "name": "vm",
        "namespace": "t1",
        "uid": uid,
        "resourceVersion": str(version),
        "annotations": annotations,
    }
    if labelled:
        meta["labels"] = {LABEL_DEVICE_REFERENCE: TRUE}
    return {"metadata": meta, "status": {"phase": "Running"}}


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The VMI names whose annotation the view parsed, in order."""
    calls: list[str] = []
    plain = references.device_names

    def counted(vmi: str, annotations: Any) -> frozenset[str]:
        calls.append(vmi)
        return plain(vmi, annotations)

    monkeypatch.setattr(references, "device_names", counted)
    return calls


def test_a_labelled_vmis_annotation_is_parsed_once_however_often_the_vmi_changes(parses: list[str]) -> None:
    """Status updates and other annotations leave the devices annotation as it was: read once. Before, each of the
    ten events parsed it again."""
    view = View(cluster())
    for version in range(1, 11):
        view.apply(kinds.VMI, _vmi([{"device": "d"}], version, note=f"patch {version}"))
    assert parses == ["vm"] and view.cluster.vmis.names_device("t1", "vm", "d")
    view.apply(kinds.VMI, _vmi([{"device": "e"}], 11))
    assert parses == ["vm", "vm"] and view.cluster.vmis.names_device("t1", "vm", "e")


def test_an_unlabelled_vmis_annotation_is_never_parsed_however_fat(parses: list[str]) -> None:
    """A VMI without the device-reference label went through no admission of ours: its annotation names nothing the
    operator gave it, and is not read at all. Before, a 4,000-entry annotation was parsed on every event."""
    view = View(cluster())
    fat = [{"device": f"d{i:04d}-{'x' * 200}"} for i in range(4000)]
    for version in range(1, 4):
        view.apply(kinds.VMI, _vmi(fat, version, labelled=False))
    assert parses == [] and not view.cluster.vmis.names_device("t1", "vm", fat[0]["device"])


def test_more_references_than_any_vmi_may_list_name_nothing(parses: list[str]) -> None:
    """Past `references.MOST` (the most `--max-devices-per-vmi` allows) no VMI was admitted: the view reads no entry of
    it, whatever its size."""
    view = View(cluster())
    view.apply(kinds.VMI, _vmi([{"device": f"d{i}"} for i in range(references.MOST + 1)], 1))
    assert parses == ["vm"] and not view.cluster.vmis.names_device("t1", "vm", "d0")


def test_a_label_taken_off_after_admission_keeps_what_the_vmi_named(parses: list[str]) -> None:
    """What the VMI was admitted with stays its set: removing the label changes nothing the view says it names."""
    view = View(cluster())
    view.apply(kinds.VMI, _vmi([{"device": "d"}], 1))
    view.apply(kinds.VMI, _vmi([{"device": "other"}], 2, labelled=False))
    assert view.cluster.vmis.names_device("t1", "vm", "d") and not view.cluster.vmis.names_device("t1", "vm", "other")


def test_another_vmi_object_of_the_name_unlabelled_names_nothing_of_the_first(parses: list[str]) -> None:
    """A delete and a re-create of the name that a watch gap hid reach the view as one change of uid: the new,
    unlabelled object went through no admission of ours and names nothing, whatever the first one named."""
    view = View(cluster())
    view.apply(kinds.VMI, _vmi([{"device": "d"}], 1))
    view.apply(kinds.VMI, _vmi([{"device": "d"}], 2, labelled=False, uid="u2"))
    assert not view.cluster.vmis.names_device("t1", "vm", "d") and parses == ["vm"]
