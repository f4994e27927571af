"""The generated CRD: fresh, deterministic, structural, complete (names, columns, status, rules)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import pytest
from asp_validators import CRD_PATH, ROOT, crd, evaluate_rule, open_api_schema

from agentpool.api import crd as crd_module
from agentpool.api import docs
from agentpool.api.structural import SchemaConversionError, structural_schema

Schema = dict[str, Any]


def walk(schema: Schema, path: str = "") -> Iterator[tuple[str, Schema]]:
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from walk(sub, f"{path}.{name}")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}.*")
    if "items" in schema:
        yield from walk(schema["items"], f"{path}[]")


def test_committed_crd_is_fresh() -> None:
    assert CRD_PATH.read_text(encoding="utf-8") == crd_module.render(), "run `make generate`"


def test_committed_field_reference_is_fresh() -> None:
    spec_md = ROOT / "docs" / "spec.md"
    assert spec_md.read_text(encoding="utf-8") == docs.render(), (
        "run `python -m agentpool.api.docs --out docs/spec.md`"
    )


def test_cli_writes_the_same_file(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "agentpool.api.crd", "--out-dir", str(tmp_path)], check=True, cwd=ROOT
    )
    written = tmp_path / "agentservingpools.agentpool.io.yaml"
    assert written.read_bytes() == CRD_PATH.read_bytes()


def test_identity_names_columns_and_status_subresource() -> None:
    doc = crd()
    assert doc["apiVersion"] == "apiextensions.k8s.io/v1"
    assert doc["metadata"]["name"] == "agentservingpools.agentpool.io"
    spec = doc["spec"]
    assert spec["group"] == "agentpool.io"
    assert spec["names"]["kind"] == "AgentServingPool"
    assert spec["names"]["shortNames"] == ["asp"]
    assert spec["scope"] == "Namespaced"
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert list(columns) == ["Ready", "Nodes", "Serving", "Split", "Desired", "Policy", "Age"]
    assert columns["Serving"]["jsonPath"] == ".status.readyNodes"
    assert columns["Desired"]["jsonPath"] == ".status.desiredSplit.label"
    assert columns["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Age"]["type"] == "date"


def test_schema_is_structural() -> None:
    """The structural-schema rules kube-apiserver enforces on apiextensions v1 CRDs."""
    root = open_api_schema()
    assert root["type"] == "object" and "additionalProperties" not in root
    # metadata at the root may restrict nothing (but name and generateName): only its type
    assert root["properties"]["metadata"] == {"type": "object"}
    problems = []
    for path, node in walk(root):
        if "$ref" in node or "oneOf" in node or "allOf" in node or "not" in node:
            problems.append(f"{path}: $ref/oneOf/allOf/not")
        if node.get("x-kubernetes-int-or-string"):
            if node.get("anyOf") != [{"type": "integer"}, {"type": "string"}] or "type" in node:
                problems.append(f"{path}: int-or-string must be untyped with anyOf [integer, string]")
        elif "anyOf" in node:
            problems.append(f"{path}: anyOf outside int-or-string")
        elif "type" not in node:
            problems.append(f"{path}: no type")
        if "properties" in node and "additionalProperties" in node:
            problems.append(f"{path}: properties together with additionalProperties")
        if node.get("additionalProperties") is False or node.get("nullable"):
            problems.append(f"{path}: additionalProperties false / nullable")
        if node.get("x-kubernetes-preserve-unknown-fields") and "properties" in node:
            problems.append(f"{path}: preserve-unknown-fields with properties")
        if "exclusiveMinimum" in node and not isinstance(node["exclusiveMinimum"], bool):
            problems.append(f"{path}: exclusiveMinimum must be boolean in OpenAPI v3.0")
        for key in node.get("required", []):
            if key not in node.get("properties", {}):
                problems.append(f"{path}: required {key} is not a property")
        for key in node.get("x-kubernetes-list-map-keys", []):
            if key not in node["items"].get("required", []):
                problems.append(f"{path}: list-map key {key} must be required")
    assert problems == []


def test_every_field_has_a_description() -> None:
    spec_and_status = {k: v for k, v in open_api_schema()["properties"].items() if k in ("spec", "status")}
    missing = [
        path
        for name, sub in spec_and_status.items()
        for path, node in walk(sub, name)
        if not path.endswith(("[]", ".*")) and not node.get("description")
    ]
    assert missing == []


def test_every_default_is_valid_under_its_own_schema() -> None:
    """kube-apiserver rejects a CRD whose defaults do not validate (schema and CEL rules)."""
    for path, node in walk(open_api_schema()):
        if "default" not in node:
            continue
        jsonschema.Draft4Validator(node).validate(node["default"])
        for rule in node.get("x-kubernetes-validations", []):
            assert evaluate_rule(rule["rule"], node["default"]), (path, rule)


def test_every_cel_rule_compiles() -> None:
    env = celpy.Environment()
    rules = [rule for _, node in walk(open_api_schema()) for rule in node.get("x-kubernetes-validations", [])]
    assert len(rules) >= 20
    for rule in rules:
        env.compile(rule["rule"])
        assert rule["message"]
        assert "fieldPath" not in rule or rule["fieldPath"].startswith(".")


def test_strings_checked_by_cel_are_bounded() -> None:
    """CEL cost estimation needs a maxLength on strings that rules scan (e.g. `matches`)."""
    for path, node in walk(open_api_schema()):
        rules = " ".join(r["rule"] for r in node.get("x-kubernetes-validations", []))
        if node.get("type") == "string" and "matches(" in rules:
            assert "maxLength" in node, path


def test_an_unsupported_construct_is_an_error() -> None:
    from pydantic import BaseModel

    class Unrepresentable(BaseModel):
        either: int | list[int]

    with pytest.raises(SchemaConversionError, match="anyOf"):
        structural_schema(Unrepresentable)


@pytest.mark.parametrize("kube_version", ["1.30", "1.31", "1.37"])
def test_crd_matches_the_apiextensions_v1_schema(kube_version: str) -> None:
    """The CRD document itself against Kubernetes' published CustomResourceDefinition schema, strict
    (unknown keys such as a misspelled `x-kubernetes-validations` entry are errors)."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kubernetes_validate.validate(crd(), kube_version, strict=True)
