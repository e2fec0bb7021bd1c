"""Writes the chart's values.schema.json from its values.yaml (issue 23 item 2), or checks it is current.

`make chart-files` writes it; `make lint` runs `--check`. Helm validates every install, upgrade, `helm template` and
`helm lint` against it, so a wrong type (`--set operator.bindTimeout=abc`) or an unknown key (`--set oprator.typo=1`)
fails before anything is written, not when the pod starts.

What the schema says of each value, in this order, later winning:
- its type, from its default: a map with keys lists them and refuses others (additionalProperties: false); an
  empty map `{}` is free-form (labels, selectors, affinity); a list's items take the type of its first item, or
  any object when that is a map (Kubernetes structures); a null default must be annotated;
- for a value the Deployment passes to the operator as `COZYGPU_<NAME>` (`{{ .Values.x | quote }}` in
  templates/deployment.yaml), the operator's own Settings field's type and bounds (cozygpu.settings), so the chart
  refuses what `cozygpu run` would; an integer default stays integer where the setting takes any number (helm's
  `--set` reads `2.5` as a string, so whole numbers are what a chart value can be set to on the command line);
- a `# @schema {...}` line in the comment above the key in values.yaml: JSON merged over the rest. With "type" in
  it, nothing is inferred from the default (a map with defaults becomes free-form: `{"type": "object"}` for
  resources; nullable: `{"type": ["object", "null"]}`), though a setting's bounds still apply.
The other lines of the comment above a key, and a comment after a scalar on its line, are its description (else
the setting's).

A new value needs nothing more than its default, unless it is an enum, has bounds no setting gives, or is null.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from cozygpu.settings import Settings

CHART = Path(__file__).resolve().parents[1] / "charts" / "cozy-gpu-operator"
OUTPUT = CHART / "values.schema.json"
ANNOTATION = "# @schema"
# The Deployment's environment entries that carry a value as it is.
SETTING = re.compile(r"\{name: COZYGPU_(\w+), value: \{\{ \.Values\.([\w.]+) \| quote \}\}\}")
# Settings' JSON schema keywords the chart's schema takes over.
BOUNDS = (
    "description",
    "type",
    "enum",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
)
SCALARS: tuple[tuple[type, str], ...] = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"))


class SchemaError(ValueError):
    pass


def settings_bounds(deployment: str) -> dict[str, dict[str, Any]]:
    """Value path -> the schema of the Settings field the Deployment passes it to."""
    fields = Settings.model_json_schema()["properties"]
    bound = {}
    for name, path in SETTING.findall(deployment):
        field = fields.get(name.lower())
        if field is None:
            raise SchemaError(f"templates/deployment.yaml passes {path} as COZYGPU_{name}, which is no setting")
        bound[path] = {k: field[k] for k in BOUNDS if k in field}
    return bound


def scalar_type(value: Any) -> str:
    for kind, name in SCALARS:
        if isinstance(value, kind):
            return name
    raise SchemaError(f"no JSON type for {value!r}")


def _comment_above(lines: list[str], line: int) -> list[str]:
    """The comment lines right above a line (0-based), top first."""
    block: list[str] = []
    while line > 0 and lines[line - 1].strip().startswith("#"):
        line -= 1
        block.insert(0, lines[line].strip())
    return block


def _notes(lines: list[str], key: yaml.Node, value: yaml.Node, path: str) -> tuple[dict[str, Any], str]:
    """The key's annotation (merged JSON of its @schema lines) and description (the rest of its comments)."""
    annotation: dict[str, Any] = {}
    text = []
    for comment in _comment_above(lines, key.start_mark.line):
        if comment.startswith(ANNOTATION):
            try:
                annotation.update(json.loads(comment[len(ANNOTATION) :]))
            except ValueError as e:
                raise SchemaError(f"values.yaml line {key.start_mark.line}: {path}'s @schema is not JSON: {e}") from e
        else:
            text.append(comment.lstrip("#").strip())
    if isinstance(value, yaml.ScalarNode) and value.end_mark.line == key.start_mark.line:
        after = lines[value.end_mark.line][value.end_mark.column :].strip()
        if after.startswith("#"):
            text.append(after.lstrip("#").strip())
    return annotation, " ".join(t for t in text if t)


def _construct(node: yaml.Node) -> Any:
    """A node's value, as yaml.safe_load reads it."""
    return yaml.SafeLoader("").construct_object(node, deep=True)


def _infer(node: yaml.Node, path: str, lines: list[str], bound: dict[str, dict[str, Any]]) -> dict[str, Any]:
    value = _construct(node)
    if isinstance(node, yaml.MappingNode) and value:
        properties = {}
        for key, child in node.value:  # by the key as written: Helm's keys are strings
            properties[key.value] = _value(key, child, f"{path}.{key.value}".lstrip("."), lines, bound)
        return {"type": "object", "properties": properties, "additionalProperties": False}
    if isinstance(value, dict):
        return {"type": "object"}
    if isinstance(value, list):
        if not value:
            return {"type": "array"}
        first = value[0]
        return {"type": "array", "items": {"type": "object" if isinstance(first, dict) else scalar_type(first)}}
    if value is None:
        raise SchemaError(f"{path} defaults to null: say its type with {ANNOTATION} above it in values.yaml")
    return {"type": scalar_type(value)}


def _value(
    key: yaml.Node, node: yaml.Node, path: str, lines: list[str], bound: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    annotation, description = _notes(lines, key, node, path)
    inferred = {} if "type" in annotation else _infer(node, path, lines, bound)
    setting = dict(bound.get(path, {}))
    if inferred.get("type") == "integer" and setting.get("type") == "number":
        del setting["type"]  # whole seconds: `--set x=2.5` gives helm a string, so only integers are settable there
    merged = {**inferred, **setting, **annotation}
    if description:  # values.yaml's own words over the setting's
        merged["description"] = description
    return {"description": merged.pop("description"), **merged} if "description" in merged else merged


def schema(values_yaml: str, deployment: str = "") -> dict[str, Any]:
    """The values' JSON schema (draft-07) from values.yaml's text and the Deployment template's."""
    root = yaml.compose(values_yaml, Loader=yaml.SafeLoader)
    if not isinstance(root, yaml.MappingNode):
        raise SchemaError("values.yaml is not a map")
    bound = settings_bounds(deployment)
    inferred = _infer(root, "", values_yaml.splitlines(), bound)
    unknown = sorted(set(bound) - set(_paths(inferred)))
    if unknown:
        raise SchemaError(f"templates/deployment.yaml reads values that values.yaml lacks: {', '.join(unknown)}")
    # Helm hands a chart used as a subchart its parent's `global` values.
    inferred["properties"]["global"] = {"type": "object", "description": "Helm's values shared with subcharts."}
    return {"$schema": "http://json-schema.org/draft-07/schema#", "title": "cozy-gpu-operator values", **inferred}


def _paths(node: dict[str, Any], prefix: str = "") -> list[str]:
    found = []
    for name, child in node.get("properties", {}).items():
        path = f"{prefix}{name}"
        found += [path, *_paths(child, f"{path}.")]
    return found


def rendered(chart: Path = CHART) -> str:
    values = (chart / "values.yaml").read_text()
    deployment = (chart / "templates" / "deployment.yaml").read_text()
    return json.dumps(schema(values, deployment), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if values.schema.json is not what it would write")
    args = parser.parse_args(argv)
    try:
        text = rendered()
    except SchemaError as e:
        print(f"chart-schema: {e}", file=sys.stderr)
        return 2
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"chart-schema: {OUTPUT} is not what values.yaml says; run `make chart-files`", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(OUTPUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
