"""Parsing a VMI's devices annotation (§1.5, §3.2) into references.

Every malformed input becomes a `ReferenceError` whose message names the entry and
what is wrong with it; nothing here raises anything else, whatever the input. Callers:
the VMI webhook (through decisions.admission) and the view, which keeps the devices
each VMI names (`device_names`, §14.2).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from cozygpu.api.names import ANNOTATION_DEVICES, is_object_name, template_device_name


class ReferenceError(ValueError):
    """The annotation is not a valid list of device references."""


@dataclass(frozen=True)
class HeldRef:
    """`{"device": name}`: a GPUDevice the tenant holds."""

    name: str


@dataclass(frozen=True)
class TemplateRef:
    """`{"deviceTemplate": {"className", "count"}}`: a device made for this VMI alone."""

    class_name: str
    count: int


Ref = HeldRef | TemplateRef


def valid_name(value: Any) -> bool:
    return isinstance(value, str) and is_object_name(value)


def _entry(index: int, raw: Any) -> Ref:
    where = f"entry {index}"
    if not isinstance(raw, dict) or len(raw) != 1 or next(iter(raw)) not in ("device", "deviceTemplate"):
        raise ReferenceError(f'{where} must be exactly one of {{"device": ...}} or {{"deviceTemplate": ...}}')
    if "device" in raw:
        name = raw["device"]
        if not valid_name(name):
            raise ReferenceError(f"{where}: device {json.dumps(name)} is not a valid object name")
        return HeldRef(name)
    template = raw["deviceTemplate"]
    if not isinstance(template, dict) or set(template) != {"className", "count"}:
        raise ReferenceError(f"{where}: deviceTemplate must have exactly className and count")
    class_name, count = template["className"], template["count"]
    if not valid_name(class_name):
        raise ReferenceError(f"{where}: className {json.dumps(class_name)} is not a valid object name")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ReferenceError(f"{where}: count must be a whole number of at least 1, not {json.dumps(count)}")
    return TemplateRef(class_name, count)


# The most references any VMI may list (`--max-devices-per-vmi` is at most this): the view reads no more of one.
MOST = 4096


def parse(annotations: dict[str, str] | None, limit: int | None = None) -> list[Ref]:
    """§3.2: the annotation must be a non-empty JSON array of valid entries, at most `limit` of them (checked
    before any entry is looked at: one VMI's work must stay small beside everyone else's)."""
    if annotations is not None and not isinstance(annotations, dict):
        raise ReferenceError("metadata.annotations is not a map of strings")
    text = (annotations or {}).get(ANNOTATION_DEVICES)
    if text is None:
        raise ReferenceError(f"annotation {ANNOTATION_DEVICES} is missing")
    if not isinstance(text, str):
        raise ReferenceError(f"annotation {ANNOTATION_DEVICES} is not a string")
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        raise ReferenceError(f"annotation {ANNOTATION_DEVICES} is not valid JSON") from None
    if not isinstance(raw, list):
        raise ReferenceError(f"annotation {ANNOTATION_DEVICES} must be a JSON array of device references")
    if not raw:
        raise ReferenceError(f"annotation {ANNOTATION_DEVICES} lists no devices")
    if limit is not None and len(raw) > limit:
        raise ReferenceError(
            f"annotation {ANNOTATION_DEVICES} lists {len(raw)} devices; a VMI may reference at most {limit} "
            "(the operator's max-devices-per-vmi setting)"
        )
    try:
        return [_entry(i, entry) for i, entry in enumerate(raw)]
    except ReferenceError as e:
        raise ReferenceError(f"annotation {ANNOTATION_DEVICES}: {e}") from None


def device_names(vmi: str, annotations: Any) -> frozenset[str]:
    """The GPUDevices the VMI `vmi` names: its held devices and its template entries' devices; none if the
    annotation cannot be read or lists more than any VMI may (such a VMI went through no admission of ours)."""
    try:
        refs = parse(annotations, MOST)
    except ReferenceError:
        return frozenset()
    return frozenset(r.name if isinstance(r, HeldRef) else template_device_name(vmi, i) for i, r in enumerate(refs))
