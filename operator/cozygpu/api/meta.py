"""Shapes every kind shares: the model base, object metadata, conditions, time.

Imported by the kind modules (`gpuclass`, `gpudevice`, `gpunode`, `gpubudget`) and
by `crdgen`. Models accept what the API server returns (unknown fields ignored)
and serialise back with the API's camelCase names.
"""

from __future__ import annotations

import datetime as dt
import sys
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer
from pydantic.alias_generators import to_camel


def _rfc3339(value: dt.datetime) -> str:
    # Kubernetes times are RFC 3339 in UTC with a Z; Python would write +00:00.
    return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


Time = Annotated[dt.datetime, PlainSerializer(_rfc3339, return_type=str)]


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Model(BaseModel):
    """Base of every API shape: camelCase on the wire, unknown fields ignored."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        use_enum_values=False,
    )

    def wire(self) -> dict[str, Any]:
        """The object as the API server wants it: aliases, no unset optionals."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class OwnerReference(Model):
    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(Model):
    name: str = ""
    generate_name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: Time | None = None
    deletion_timestamp: Time | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    finalizers: list[str] = Field(default_factory=list)
    owner_references: list[OwnerReference] = Field(default_factory=list)


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(Model):
    """A Kubernetes-style condition (metav1.Condition's shape)."""

    type: str = Field(min_length=1, max_length=316)
    status: ConditionStatus
    reason: str = Field(default="", max_length=1024)
    message: str = Field(default="", max_length=32768)
    last_transition_time: Time | None = None
    observed_generation: int | None = Field(default=None, ge=0)


# Conditions are a list keyed by type, merged per entry by server-side apply.
CONDITIONS_SCHEMA: dict[str, Any] = {
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
}


@dataclass(frozen=True)
class PrinterColumn:
    name: str
    json_path: str
    type: str = "string"
    priority: int = 0
    description: str = ""


@dataclass(frozen=True)
class CRDInfo:
    """What the CRD of a kind says besides its schema."""

    kind: str
    plural: str
    singular: str
    namespaced: bool
    short_names: tuple[str, ...]
    columns: tuple[PrinterColumn, ...] = field(default=())
    categories: tuple[str, ...] = ("cozy-gpu",)


# Shared by every object read from the wire. Nothing here asks which fields were set (`wire` drops None,
# not unset fields), and pydantic's per-object set of them was a third of the view's memory at 50,000
# devices (§13.3). A model_copy gets a set of its own; an attribute assignment adds a name to this one,
# which is harmless, as nothing reads it.
_UNTRACKED: set[str] = set()


def _compact(value: Any) -> None:
    """Every model inside `value` shares `_UNTRACKED`, and its strings are interned (names of nodes,
    namespaces and classes, reasons and messages repeat across thousands of devices)."""
    if isinstance(value, BaseModel):
        object.__setattr__(value, "__pydantic_fields_set__", _UNTRACKED)
        fields = value.__dict__
        for name, item in fields.items():
            if type(item) is str:
                fields[name] = sys.intern(item)
            else:
                _compact(item)
    elif isinstance(value, list):
        for item in value:
            _compact(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            if type(item) is str:
                value[key] = sys.intern(item)


class Resource(Model):
    """A whole object of one of our kinds: metadata, spec, status."""

    crd: ClassVar[CRDInfo]

    api_version: str = ""
    kind: str = ""
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> Self:
        """The object, compacted for a long life in the view (`_compact`)."""
        obj = cls.model_validate(body)
        _compact(obj)
        return obj

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str | None:
        return self.metadata.namespace

    @property
    def key(self) -> tuple[str, str]:
        """(namespace, name), "" for a cluster-scoped object's namespace: how the view and the workers key it."""
        return (self.metadata.namespace or "", self.metadata.name)

    @property
    def deleting(self) -> bool:
        return self.metadata.deletion_timestamp is not None


AGE = PrinterColumn("Age", ".metadata.creationTimestamp", "date")
