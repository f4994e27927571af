"""The base of every spec model and its cross-field rules, written once for both validators.

A :class:`CrossFieldRule` carries the rule twice, side by side: as a CEL expression that the CRD
puts into `x-kubernetes-validations` (kube-apiserver evaluates it) and as a Python predicate that
the pydantic model evaluates. Both report the same `message`; the manifest table tests
(`tests/unit/api`) check that the two agree on every good and bad manifest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, GetJsonSchemaHandler, model_validator
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema


@dataclass(frozen=True, slots=True)
class CrossFieldRule:
    """One validation rule over a model: `cel` for the CRD, `holds` for pydantic.

    `field_path` (e.g. `.initialSplit.prefill`) tells kube-apiserver which field to blame;
    it is relative to the object the rule is attached to.
    """

    cel: str
    message: str
    holds: Callable[[Any], bool]
    field_path: str | None = None

    def x_kubernetes_validation(self) -> dict[str, str]:
        entry = {"rule": self.cel, "message": self.message}
        if self.field_path is not None:
            entry["fieldPath"] = self.field_path
        return entry


def _json_number(value: Any) -> Any:
    """`6.0` -> `6`, also inside plain maps and lists (quantities in `resources.requests`)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _json_number(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_number(item) for item in value]
    return value


class ApiModel(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields are errors; immutable.

    Validation follows kube-apiserver where pydantic would be laxer: types are strict (`"9"` is not
    an integer, `"yes"` not a boolean), a `null` value counts as absent (the apiserver prunes
    nulls of non-nullable fields before defaulting) and a whole-valued float such as `6.0` is the
    integer it stands for (Kubernetes' JSON decoding does the same), so both accept and reject the
    same manifests.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        strict=True,
        use_attribute_docstrings=True,
    )

    rules: ClassVar[tuple[CrossFieldRule, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {key: _json_number(value) for key, value in data.items() if value is not None}
        return data

    @model_validator(mode="after")
    def _check_rules(self) -> Self:
        broken = [rule.message for rule in self.rules if not rule.holds(self)]
        if broken:
            raise ValueError("; ".join(broken))
        return self

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        schema = handler(core_schema)
        if cls.rules:
            target = handler.resolve_ref_schema(schema)
            target["x-kubernetes-validations"] = [r.x_kubernetes_validation() for r in cls.rules]
        return schema

    def to_wire(self) -> dict[str, Any]:
        """The manifest form: camelCase keys, unset optional sections left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
