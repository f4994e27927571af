"""Turn a pydantic model's JSON schema into a Kubernetes structural schema (OpenAPI v3 subset).

What changes on the way (kube-apiserver accepts only structural schemas in apiextensions v1):

- `$ref`/`$defs` are inlined; `title` is dropped;
- optional fields (`anyOf: [X, null]`) become `X`: absent means unset, there is no `null`;
- `int | str` becomes `x-kubernetes-int-or-string` with the string pattern outside the `anyOf`
  (the one `anyOf` shape structural schemas allow);
- `additionalProperties: false` (pydantic's `extra="forbid"`) is dropped: Kubernetes prunes or,
  under strict field validation (kubectl's default), rejects unknown fields instead;
  `dict[str, Any]` becomes `x-kubernetes-preserve-unknown-fields`;
- `exclusiveMinimum: x` becomes OpenAPI 3.0's `minimum: x` + `exclusiveMinimum: true`;
- object defaults shrink to the smallest value that Kubernetes' recursive defaulting expands back
  to pydantic's default (e.g. `planner: {}`), which is checked here.

Any other JSON-schema keyword is an error, so a new pydantic construct cannot slip through unseen.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

Schema = dict[str, Any]

_KEY_ORDER = (
    "description",
    "type",
    "format",
    "enum",
    "default",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "maxProperties",
    "required",
    "properties",
    "additionalProperties",
    "items",
    "anyOf",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-validations",
)
_PASSTHROUGH = frozenset(_KEY_ORDER) - {"properties", "additionalProperties", "items", "anyOf", "default"}
_DROPPED = frozenset({"title"})


class SchemaConversionError(ValueError):
    """The pydantic schema uses a construct that has no structural equivalent here."""


def structural_schema(model: type[BaseModel]) -> Schema:
    """The structural OpenAPI v3 schema of `model` (camelCase property names)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs: dict[str, Schema] = raw.pop("$defs", {})
    return _convert(raw, defs)


def apply_defaults(value: Any, schema: Schema) -> Any:
    """What kube-apiserver's structural defaulting does: fill absent properties, recursively."""
    if isinstance(value, dict):
        properties: dict[str, Schema] | None = schema.get("properties")
        if properties is not None:
            out = dict(value)
            for key, sub in properties.items():
                if key not in out and "default" in sub:
                    out[key] = copy.deepcopy(sub["default"])
                if key in out:
                    out[key] = apply_defaults(out[key], sub)
            return out
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            return {key: apply_defaults(item, extra) for key, item in value.items()}
    if isinstance(value, list) and "items" in schema:
        return [apply_defaults(item, schema["items"]) for item in value]
    return value


def _ordered(schema: Schema) -> Schema:
    rank = {key: i for i, key in enumerate(_KEY_ORDER)}
    return {key: schema[key] for key in sorted(schema, key=lambda k: (rank.get(k, len(rank)), k))}


def _convert(node: Schema, defs: dict[str, Schema]) -> Schema:
    node = dict(node)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        return _ordered({**_convert(target, defs), **_convert(node, defs)})
    if "anyOf" in node:
        return _ordered({**_convert_any_of(node.pop("anyOf"), defs), **_convert(node, defs)})
    out: Schema = {}
    for key, value in node.items():
        if key in _DROPPED or (key == "default" and value is None):
            continue
        if key == "properties":
            out["properties"] = {name: _convert(sub, defs) for name, sub in value.items()}
        elif key == "additionalProperties":
            if value is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif isinstance(value, dict):
                out["additionalProperties"] = _convert(value, defs)
        elif key == "items":
            out["items"] = _convert(value, defs)
        elif key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "default":
            out["default"] = value
        elif key == "description":
            out["description"] = " ".join(value.split())
        elif key in _PASSTHROUGH:
            out[key] = copy.deepcopy(value)  # a $def inlined twice shares no list (no YAML anchors)
        else:
            raise SchemaConversionError(f"no structural equivalent for JSON-schema keyword {key!r}: {node}")
    for name, sub in out.get("properties", {}).items():
        if isinstance(sub.get("default"), dict):
            sub["default"] = _minimal_default(sub["default"], sub, name)
    return _ordered(out)


def _convert_any_of(variants: list[Schema], defs: dict[str, Schema]) -> Schema:
    present = [v for v in variants if v.get("type") != "null"]
    if len(present) == 1:
        return _convert(present[0], defs)
    by_type = {v.get("type"): _convert(v, defs) for v in present}
    if len(present) == 2 and set(by_type) == {"integer", "string"}:
        integer, string = by_type["integer"], by_type["string"]
        out: Schema = {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
        }
        for key in ("minimum", "maximum"):
            if key in integer:
                out[key] = integer[key]
        for key in ("pattern", "maxLength"):
            if key in string:
                out[key] = string[key]
        return out
    raise SchemaConversionError(f"no structural equivalent for anyOf {variants}")


def _minimal_default(full: dict[str, Any], schema: Schema, where: str) -> dict[str, Any]:
    """The smallest default that structural defaulting expands back to `full` (nulls left out)."""
    expected = _without_nulls(full)
    properties: dict[str, Schema] = schema.get("properties", {})
    minimal: dict[str, Any] = {}
    for key, value in expected.items():
        sub = properties.get(key)
        if sub is None:
            minimal[key] = value
        elif "default" in sub and apply_defaults(sub["default"], sub) == value:
            continue
        elif isinstance(value, dict):
            minimal[key] = _minimal_default(value, sub, f"{where}.{key}")
        else:
            minimal[key] = value
    if apply_defaults(minimal, schema) != expected:
        raise SchemaConversionError(f"default of {where} does not survive Kubernetes defaulting: {full}")
    return minimal


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value
