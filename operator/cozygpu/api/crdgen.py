"""Builds the CustomResourceDefinitions of `crds/` from the models.

Called by `cozygpu crds` (`make crds`) to write the files and by the drift test to
compare them. Pydantic emits JSON Schema with `$ref`s and `anyOf: [X, null]`;
Kubernetes wants structural schemas, so this inlines references, drops nulls,
titles and defaults (the operator computes effective values itself), and keeps
the `x-kubernetes-*` extensions the models carry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from cozygpu.api import KINDS
from cozygpu.api.meta import Resource
from cozygpu.api.names import GROUP, VERSION

_KEEP = {
    "type",
    "format",
    "description",
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "pattern",
}

HEADER = "# Generated from the models in operator/cozygpu/api by `make crds`. Do not edit.\n"


def _structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in schema:
        target = defs[schema["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return _structural(merged, defs)
    if "anyOf" in schema:
        options = [s for s in schema["anyOf"] if s.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot make a structural schema of anyOf {schema['anyOf']}")
        merged = {**options[0], **{k: v for k, v in schema.items() if k != "anyOf"}}
        return _structural(merged, defs)
    out: dict[str, Any] = {k: v for k, v in schema.items() if k in _KEEP or k.startswith("x-kubernetes-")}
    if "properties" in schema:
        out["type"] = "object"
        out["properties"] = {k: _structural(v, defs) for k, v in schema["properties"].items()}
        if schema.get("required"):
            out["required"] = list(schema["required"])
    if isinstance(schema.get("additionalProperties"), dict):
        out["additionalProperties"] = _structural(schema["additionalProperties"], defs)
    if "items" in schema:
        out["items"] = _structural(schema["items"], defs)
    if "type" not in out:
        raise ValueError(f"schema without a type: {schema}")
    return out


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of one model, as a CRD embeds it."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _structural(raw, raw.get("$defs", {}))


def crd(kind: type[Resource]) -> dict[str, Any]:
    info = kind.crd
    fields = kind.model_fields
    spec_model = fields["spec"].annotation
    status_model = fields["status"].annotation
    assert isinstance(spec_model, type)
    assert issubclass(spec_model, BaseModel)
    assert isinstance(status_model, type)
    assert issubclass(status_model, BaseModel)
    root: dict[str, Any] = {
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": model_schema(spec_model),
            "status": model_schema(status_model),
        },
    }
    if fields["spec"].is_required():
        root["required"] = ["spec"]
    names: dict[str, Any] = {
        "kind": info.kind,
        "listKind": f"{info.kind}List",
        "plural": info.plural,
        "singular": info.singular,
        "shortNames": list(info.short_names),
        "categories": list(info.categories),
    }
    columns = [
        {
            "name": c.name,
            "type": c.type,
            "jsonPath": c.json_path,
            **({"priority": c.priority} if c.priority else {}),
            **({"description": c.description} if c.description else {}),
        }
        for c in info.columns
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{info.plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced" if info.namespaced else "Cluster",
            "names": names,
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


def rendered() -> dict[str, str]:
    """File name -> YAML text, for every kind."""
    return {
        f"{GROUP}_{kind.crd.plural}.yaml": HEADER
        + yaml.safe_dump(crd(kind), sort_keys=False, width=100, allow_unicode=True)
        for kind in KINDS
    }


def write(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in rendered().items():
        path = directory / name
        path.write_text(text)
        written.append(path)
    return written
