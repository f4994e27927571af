"""The two validators of an AgentServingPool manifest, as the tests run them.

- ``pydantic_errors``: `AgentServingPool.model_validate`, as the operator does.
- ``crd_errors``: what kube-apiserver does with the committed CRD, step by step: strict field
  validation (kubectl's default: an unknown field is an error), structural defaulting (nulls of
  non-nullable fields pruned, then absent fields defaulted), the
  openAPIV3Schema (evaluated with jsonschema's Draft 4 validator, the JSON-schema dialect OpenAPI 3.0
  builds on: boolean `exclusiveMinimum`, `anyOf` for int-or-string) and then the CEL rules of
  `x-kubernetes-validations`, evaluated by a real CEL implementation (cel-python), with `self`
  bound to the object each rule is attached to.

Deliberately independent of `agentpool.api.structural` (which also knows how to default): the
emulation must not share the code it checks.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import yaml
from pydantic import ValidationError

from agentpool.api import AgentServingPool

ROOT = Path(__file__).resolve().parents[3]
CRD_PATH = ROOT / "crds" / "agentservingpools.agentpool.io.yaml"
EXAMPLES = ROOT / "examples"

Schema = dict[str, Any]


@functools.cache
def crd() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text(encoding="utf-8"))
    return loaded


def open_api_schema() -> Schema:
    schema: Schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def load_example(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text(encoding="utf-8"))
    return loaded


# ---------------------------------------------------------------- pydantic


def pydantic_errors(manifest: dict[str, Any]) -> list[str]:
    try:
        AgentServingPool.model_validate(manifest)
    except ValidationError as exc:
        return [f"{_dotted(err['loc'])}: {err['msg']}" for err in exc.errors()]
    return []


def _dotted(loc: tuple[int | str, ...]) -> str:
    # pydantic puts the tagged-union / int-or-string branch names into loc; keep the field path.
    parts = [str(p) for p in loc if not (isinstance(p, str) and p in {"int", "str", "constrained-str"})]
    return ".".join(parts)


# ---------------------------------------------------------------- kube-apiserver emulation


def crd_errors(manifest: dict[str, Any]) -> list[str]:
    schema = open_api_schema()
    unknown = list(_unknown_fields(manifest, schema, ""))
    if unknown:
        return unknown
    obj = _default(_drop_nulls(copy.deepcopy(manifest), schema), schema)
    structural = [
        f"{_path(err.absolute_path)}: {err.message}"
        for err in sorted(_validator().iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    ]
    structural += _duplicate_list_map_keys(obj, schema, "")
    if structural:
        return structural
    return list(_cel_errors(obj, schema, ""))


@functools.cache
def _validator() -> jsonschema.Draft4Validator:
    return jsonschema.Draft4Validator(open_api_schema())


def defaulted(manifest: dict[str, Any]) -> dict[str, Any]:
    """The object kube-apiserver would store: the manifest with the CRD's defaults filled in."""
    schema = open_api_schema()
    result: dict[str, Any] = _default(_drop_nulls(copy.deepcopy(manifest), schema), schema)
    return result


def _path(parts: Any) -> str:
    return ".".join(str(p) for p in parts)


def _join(base: str, key: str) -> str:
    return f"{base}.{key}" if base else key


def _unknown_fields(value: Any, schema: Schema, where: str) -> Iterator[str]:
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(value, dict):
        properties = schema.get("properties")
        if properties is not None:
            for key, item in value.items():
                if key not in properties:
                    yield f'unknown field "{_join(where, key)}"'
                else:
                    yield from _unknown_fields(item, properties[key], _join(where, key))
        elif isinstance(schema.get("additionalProperties"), dict):
            for key, item in value.items():
                yield from _unknown_fields(item, schema["additionalProperties"], _join(where, key))
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            yield from _unknown_fields(item, schema["items"], f"{where}[{i}]")


def _drop_nulls(value: Any, schema: Schema) -> Any:
    """Structural defaulting first prunes `null` values of fields that are not `nullable`."""
    if isinstance(value, dict) and "properties" in schema:
        return {
            key: _drop_nulls(item, schema["properties"].get(key, {}))
            for key, item in value.items()
            if item is not None or schema["properties"].get(key, {}).get("nullable")
        }
    if isinstance(value, list) and "items" in schema:
        return [_drop_nulls(item, schema["items"]) for item in value]
    return value


def _default(value: Any, schema: Schema) -> Any:
    if isinstance(value, dict):
        properties = schema.get("properties")
        if properties is not None:
            for key, sub in properties.items():
                if key not in value and "default" in sub:
                    value[key] = copy.deepcopy(sub["default"])
                if key in value:
                    value[key] = _default(value[key], sub)
        elif isinstance(schema.get("additionalProperties"), dict):
            for key in value:
                value[key] = _default(value[key], schema["additionalProperties"])
    elif isinstance(value, list) and "items" in schema:
        return [_default(item, schema["items"]) for item in value]
    return value


@functools.cache
def _program(rule: str) -> celpy.Runner:
    env = celpy.Environment()
    return env.program(env.compile(rule))


def evaluate_rule(rule: str, self_value: Any) -> bool:
    result = _program(rule).evaluate({"self": celpy.json_to_cel(self_value)})
    if not isinstance(result, celpy.celtypes.BoolType):
        raise AssertionError(f"CEL rule {rule!r} did not evaluate to a bool: {result!r}")
    return bool(result)


def _cel_errors(value: Any, schema: Schema, where: str) -> Iterator[str]:
    for validation in schema.get("x-kubernetes-validations", []):
        if not evaluate_rule(validation["rule"], value):
            blamed = where + validation.get("fieldPath", "")
            yield f"{blamed}: Invalid value: {validation['message']}"
    if isinstance(value, dict):
        properties = schema.get("properties")
        if properties is not None:
            for key, item in value.items():
                if key in properties:
                    yield from _cel_errors(item, properties[key], _join(where, key))
        elif isinstance(schema.get("additionalProperties"), dict):
            for key, item in value.items():
                yield from _cel_errors(item, schema["additionalProperties"], _join(where, key))
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            yield from _cel_errors(item, schema["items"], f"{where}[{i}]")


def _duplicate_list_map_keys(value: Any, schema: Schema, where: str) -> list[str]:
    """kube-apiserver rejects two entries with the same key in an `x-kubernetes-list-type: map`."""
    errors: list[str] = []
    if isinstance(value, list) and schema.get("x-kubernetes-list-type") == "map":
        keys = schema["x-kubernetes-list-map-keys"]
        seen: set[tuple[Any, ...]] = set()
        for i, item in enumerate(value):
            key = tuple(item.get(k) for k in keys)
            if key in seen:
                errors.append(f"{where}[{i}]: Duplicate value: {dict(zip(keys, key, strict=True))}")
            seen.add(key)
    if isinstance(value, dict):
        for key, item in value.items():
            sub = schema.get("properties", {}).get(key)
            if sub is not None:
                errors += _duplicate_list_map_keys(item, sub, _join(where, key))
    return errors
