"""The two validators of an AgentServingPool manifest, as the tests run them.

- ``pydantic_errors``: `AgentServingPool.model_validate`, as the operator does.
- ``crd_errors``: what kube-apiserver does with the committed CRD when a manifest is created or
  updated through the resource's main endpoint (`kubectl apply`), step by step: JSON decoding
  (a whole-valued float such as `6.0` becomes the integer 6), the status subresource dropping
  `.status` (only `/status` writes it; ``crd_status_errors`` emulates such a write), strict field
  validation (kubectl's default: an unknown field is an error), structural defaulting (nulls of
  non-nullable fields pruned, then absent fields defaulted), the
  openAPIV3Schema (evaluated with jsonschema's Draft 4 validator, the JSON-schema dialect OpenAPI 3.0
  builds on: boolean `exclusiveMinimum`, `anyOf` for int-or-string) and then the CEL rules of
  `x-kubernetes-validations`, evaluated by a real CEL implementation (cel-python), with `self`
  bound to the object each rule is attached to. Two departures from cel-python follow the server:
  `duration()` parses as Go's `time.ParseDuration` does, into int64 nanoseconds (cel-python
  rounds to microseconds and accepts values past Go's largest duration), and an evaluation error
  (e.g. an overflowing duration) rejects the object, as kube-apiserver does, instead of escaping.

Deliberately independent of `agentpool.api.structural` (which also knows how to default): the
emulation must not share the code it checks.
"""

from __future__ import annotations

import copy
import functools
import re
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
    """Errors of a create or update through the main endpoint (the status is dropped first)."""
    return _server_errors({k: v for k, v in manifest.items() if k != "status"})


def crd_status_errors(manifest: dict[str, Any]) -> list[str]:
    """Errors of a write to the `/status` subresource: the whole object, status included."""
    return _server_errors(manifest)


def _server_errors(manifest: dict[str, Any]) -> list[str]:
    schema = open_api_schema()
    manifest = _json_decoded(manifest)
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
    result: dict[str, Any] = _default(_drop_nulls(_json_decoded(manifest), schema), schema)
    return result


def _json_decoded(value: Any) -> Any:
    """A deep copy as Kubernetes' unstructured JSON decoding yields it: whole floats are int64."""
    if isinstance(value, dict):
        return {key: _json_decoded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_decoded(item) for item in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


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


_GO_DURATION_PART = re.compile(r"([0-9]*)(?:[.]([0-9]*))?(ns|us|µs|ms|h|m|s)")
_GO_UNIT_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}


def go_duration(text: Any) -> celpy.celtypes.IntType:
    """CEL `duration(string)` as kube-apiserver evaluates it: Go's `time.ParseDuration`, exact
    int64 nanoseconds (the rules only compare durations, so an int of nanoseconds stands in for
    the duration type); an error past Go's range or for a malformed string."""
    raw = str(text)
    body = raw.lstrip("+-")
    negative = raw.startswith("-")
    if body == "0":
        return celpy.celtypes.IntType(0)
    position, total = 0, 0
    for match in _GO_DURATION_PART.finditer(body):
        if match.start() != position or not (match.group(1) or match.group(2)):
            break
        unit = _GO_UNIT_NS[match.group(3)]
        part = int(match.group(1) or "0") * unit
        if match.group(2):
            part += int(int(match.group(2)) * (float(unit) / 10 ** len(match.group(2))))
        total += part
        if total > 2**63 - (0 if negative else 1):
            raise celpy.CELEvalError(f"duration out of range: {raw!r}")
        position = match.end()
    if position != len(body) or not body:
        raise celpy.CELEvalError(f"invalid duration: {raw!r}")
    return celpy.celtypes.IntType(-total if negative else total)


@functools.cache
def _program(rule: str) -> celpy.Runner:
    env = celpy.Environment()
    return env.program(env.compile(rule), functions={"duration": go_duration})


class RuleEvaluationError(Exception):
    """The rule raised instead of returning a bool; kube-apiserver rejects the object."""


def evaluate_rule(rule: str, self_value: Any) -> bool:
    try:
        result = _program(rule).evaluate({"self": celpy.json_to_cel(self_value)})
    except celpy.CELEvalError as exc:
        raise RuleEvaluationError(str(exc)) from exc
    if isinstance(result, celpy.CELEvalError):
        raise RuleEvaluationError(str(result))
    if not isinstance(result, celpy.celtypes.BoolType):
        raise AssertionError(f"CEL rule {rule!r} did not evaluate to a bool: {result!r}")
    return bool(result)


def _holds(rule: str, value: Any) -> bool:
    try:
        return evaluate_rule(rule, value)
    except RuleEvaluationError:
        return False


def _cel_errors(value: Any, schema: Schema, where: str) -> Iterator[str]:
    for validation in schema.get("x-kubernetes-validations", []):
        if not _holds(validation["rule"], value):
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
