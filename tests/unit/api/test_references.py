"""The devices annotation (§1.5, §3.2): valid references parse, everything else is a named refusal."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cozygpu.api.names import ANNOTATION_DEVICES
from cozygpu.api.references import HeldRef, ReferenceError, TemplateRef, parse


def ann(value: Any) -> dict[str, str]:
    return {ANNOTATION_DEVICES: value if isinstance(value, str) else json.dumps(value)}


def test_both_shapes_parse_in_order() -> None:
    """Entry order is kept: the index names the template device and the gpus entries."""
    refs = parse(ann([{"device": "train"}, {"deviceTemplate": {"className": "a10", "count": 2}}]))
    assert refs == [HeldRef("train"), TemplateRef("a10", 2)]


@pytest.mark.parametrize(
    ("annotations", "fragment"),
    [
        ({}, "is missing"),
        (ann("not json"), "is not valid JSON"),
        (ann({"device": "x"}), "must be a JSON array"),
        (ann([]), "lists no devices"),
        (ann(["x"]), "entry 0 must be exactly one of"),
        (ann([{"device": "a", "deviceTemplate": {"className": "c", "count": 1}}]), "entry 0 must be exactly one of"),
        (ann([{"disk": "a"}]), "entry 0 must be exactly one of"),
        (ann([{"device": "Bad_Name"}]), 'entry 0: device "Bad_Name" is not a valid object name'),
        (ann([{"device": 7}]), "entry 0: device 7 is not a valid object name"),
        (ann([{"device": "ok"}, {"deviceTemplate": {"className": "c"}}]), "entry 1: deviceTemplate must have"),
        (ann([{"deviceTemplate": {"className": "c", "count": 1, "x": 1}}]), "must have exactly className and count"),
        (ann([{"deviceTemplate": {"className": "c", "count": 0}}]), "count must be a whole number of at least 1"),
        (ann([{"deviceTemplate": {"className": "c", "count": 1.5}}]), "count must be a whole number"),
        (ann([{"deviceTemplate": {"className": "c", "count": True}}]), "count must be a whole number"),
        (ann([{"deviceTemplate": {"className": "C!", "count": 1}}]), 'className "C!" is not a valid object name'),
    ],
)
def test_malformed_annotations_are_refused_with_the_annotation_named(
    annotations: dict[str, str], fragment: str
) -> None:
    """§3.2: each way to be wrong says which entry and what, and names the annotation."""
    with pytest.raises(ReferenceError) as raised:
        parse(annotations)
    assert ANNOTATION_DEVICES in str(raised.value)
    assert fragment in str(raised.value)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=500, deadline=None)
@given(st.one_of(json_values.map(json.dumps), st.text(max_size=80)))
def test_no_input_raises_anything_but_a_reference_error(text: str) -> None:
    """Fuzzed: any annotation text parses or is a ReferenceError naming the annotation, never a crash."""
    try:
        refs = parse({ANNOTATION_DEVICES: text})
    except ReferenceError as e:
        message = str(e)
        refs = []
    else:
        message = ANNOTATION_DEVICES
        assert all(isinstance(r, HeldRef | TemplateRef) for r in refs)
    assert ANNOTATION_DEVICES in message


def test_more_references_than_the_cap_are_refused_before_any_entry_is_read() -> None:
    """Issue 12: one VMI's work stays small; the count is checked first, even when entries are malformed."""
    entries = [{"deviceTemplate": {"className": "a10", "count": 1}}] * 5
    assert len(parse({ANNOTATION_DEVICES: json.dumps(entries)}, limit=5)) == 5
    with pytest.raises(ReferenceError, match="lists 6 devices; a VMI may reference at most 5"):
        parse({ANNOTATION_DEVICES: json.dumps([{"nonsense": True}] * 6)}, limit=5)


@pytest.mark.parametrize(
    ("annotations", "words"),
    [({ANNOTATION_DEVICES: 7}, "is not a string"), (["not", "a", "map"], "metadata.annotations is not a map")],
)
def test_annotations_of_the_wrong_type_are_named(annotations: Any, words: str) -> None:
    """Issue 12: "the JSON object must be str, bytes or bytearray, not int" was what a tenant read."""
    with pytest.raises(ReferenceError, match=words):
        parse(annotations)
