"""The chart's values.schema.json and its generator, hack/chart-schema.py (issue 23 item 2).

What helm does with the schema (refusing a wrong type or an unknown key) is in tests/integration/test_chart_values.py;
here: the checked-in schema is the generator's, covers every value, and the generator's rules hold.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from cozygpu.settings import Settings

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "cozy-gpu-operator"


@pytest.fixture(scope="module")
def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chart_schema", REPO / "hack" / "chart-schema.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_checked_in_schema_is_what_values_yaml_says() -> None:
    """`make chart-files` output is checked in: a value added or changed without it fails here (and in make lint)."""
    done = subprocess.run(
        [sys.executable, str(REPO / "hack" / "chart-schema.py"), "--check"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def _leaves(values: dict[str, Any], prefix: str = "") -> list[str]:
    """Every key path in values.yaml, descending into maps with keys."""
    found = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        found.append(path)
        if isinstance(value, dict):
            found += _leaves(value, f"{path}.")
    return found


def _at(schema: dict[str, Any], path: str) -> dict[str, Any] | None:
    """The schema of a value path, None where a free-form map above it covers it."""
    node = schema
    for name in path.split("."):
        if "properties" not in node:
            return None
        node = node["properties"][name]
    return node


def test_every_value_has_a_type_and_only_free_form_maps_take_other_keys() -> None:
    """Each key of values.yaml has a schema with a type, unless it sits in a map annotated free-form (resources,
    selectors); the top level and `operator` refuse keys they do not list."""
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    free = [p for p in _leaves(values) if _at(schema, p) is None]
    assert all(p.startswith(("resources.", "networkPolicy.metrics.namespaceSelector.")) for p in free), free
    for path in _leaves(values):
        node = _at(schema, path)
        assert node is None or "type" in node, path
    assert schema["additionalProperties"] is False
    assert schema["properties"]["operator"]["additionalProperties"] is False
    assert set(schema["properties"]) == {*values, "global"}  # global: Helm's, for a chart used as a subchart


def test_operator_values_are_held_to_the_operators_own_settings() -> None:
    """A value the Deployment passes as COZYGPU_<NAME> takes that Settings field's bounds: the chart refuses what
    `cozygpu run` would, at install rather than when the pod starts."""
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())["properties"]
    fields = Settings.model_json_schema()["properties"]
    operator = schema["operator"]["properties"]
    assert operator["bindTimeout"]["maximum"] == fields["bind_timeout"]["maximum"]
    assert operator["bindTimeout"]["exclusiveMinimum"] == 0
    # Settings take any number of seconds; the chart whole ones, what `--set` can give (it reads 2.5 as a string).
    assert (fields["bind_timeout"]["type"], operator["bindTimeout"]["type"]) == ("number", "integer")
    assert (operator["webhookTimeout"]["type"], operator["webhookTimeout"]["maximum"]) == ("integer", 30)
    assert (operator["maxIdleMoves"]["minimum"], operator["maxIdleMoves"]["maximum"]) == (0, 64)
    assert operator["logLevel"]["enum"] == ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
    assert schema["kubevirt"]["properties"]["controllerUser"]["minLength"] == 1
    assert schema["certManager"]["properties"]["enabled"]["enum"] == ["auto", True, False]


def test_types_come_from_the_defaults(generator: ModuleType) -> None:
    """Scalars by their default; a map with keys lists them and refuses others; `{}` is free-form; a list's items
    take its first item's type, any object for a map; the comment above a key, or after it, describes it."""
    text = """# How many.
count: 2
ratio: 0.5
enabled: true
name: x  # a name
sub:
  deep: 1
labels: {}
names: [a]
peers:
  - {a: 1}
none: []
"""
    schema = generator.schema(text)
    p = schema["properties"]
    assert p["count"] == {"description": "How many.", "type": "integer"}
    assert (p["ratio"]["type"], p["enabled"]["type"]) == ("number", "boolean")
    assert p["name"] == {"description": "a name", "type": "string"}
    assert p["sub"] == {"type": "object", "properties": {"deep": {"type": "integer"}}, "additionalProperties": False}
    assert p["labels"] == {"type": "object"}
    assert p["names"] == {"type": "array", "items": {"type": "string"}}
    assert p["peers"] == {"type": "array", "items": {"type": "object"}}
    assert p["none"] == {"type": "array"}
    assert schema["additionalProperties"] is False


def test_a_schema_line_says_what_a_default_cannot(generator: ModuleType) -> None:
    """`# @schema {...}` merges over what was inferred; with a type in it nothing is inferred (free-form maps,
    nullable values); a null default without one, or a line that is not JSON, is an error naming the value."""
    text = """level: INFO  # how loud
# @schema {"enum": ["INFO", "DEBUG"]}
mode: INFO
# @schema {"type": ["object", "null"]}
selector:
  matchLabels: {a: b}
"""
    p = generator.schema(text)["properties"]
    assert p["mode"] == {"type": "string", "enum": ["INFO", "DEBUG"]}
    assert p["selector"] == {"type": ["object", "null"]}
    with pytest.raises(generator.SchemaError, match="gone defaults to null"):
        generator.schema("gone: null\n")
    with pytest.raises(generator.SchemaError, match="x's @schema is not JSON"):
        generator.schema("# @schema {minimum: 1}\nx: 1\n")


def test_a_setting_the_deployment_passes_lends_its_bounds(generator: ModuleType) -> None:
    """The Deployment's `{name: COZYGPU_X, value: {{ .Values.path | quote }}}` binds a value to Settings' field x;
    a setting that does not exist, or a value values.yaml lacks, is an error."""
    deployment = "- {name: COZYGPU_MAX_IDLE_MOVES, value: {{ .Values.operator.moves | quote }}}\n"
    schema = generator.schema("operator:\n  moves: 4\n", deployment)
    moves = schema["properties"]["operator"]["properties"]["moves"]
    assert (moves["type"], moves["minimum"], moves["maximum"]) == ("integer", 0, 64)
    with pytest.raises(generator.SchemaError, match="COZYGPU_NO_SUCH"):
        generator.schema("x: 1\n", "{name: COZYGPU_NO_SUCH, value: {{ .Values.x | quote }}}")
    with pytest.raises(generator.SchemaError, match=r"values\.yaml lacks: operator\.gone"):
        generator.schema("x: 1\n", "{name: COZYGPU_MAX_IDLE_MOVES, value: {{ .Values.operator.gone | quote }}}")
