"""The emulation and pydantic against a real server's verdicts; a replay on a real server if one is named.

`AGENTPOOL_TEST_KUBECONFIG=PATH` (and optionally `AGENTPOOL_TEST_NAMESPACE`, default `default`)
makes `test_a_real_server_agrees` install the committed CRD there and replay every verdict:
creates with `dryRun=All`, status writes on an object created for the purpose and deleted after.
"""

from __future__ import annotations

import copy
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from asp_validators import crd, crd_errors, crd_status_errors, pydantic_errors
from server_verdicts import VERDICTS, Verdict

from agentpool.api import GROUP, PLURAL, VERSION


@pytest.mark.parametrize("verdict", VERDICTS, ids=lambda v: v.name)
def test_the_emulation_agrees_with_the_server(verdict: Verdict) -> None:
    errors = (crd_status_errors if verdict.write == "status" else crd_errors)(verdict.manifest)
    assert (not errors) == verdict.accepted, errors


@pytest.mark.parametrize("verdict", VERDICTS, ids=lambda v: v.name)
def test_pydantic_agrees_with_the_server(verdict: Verdict) -> None:
    errors = pydantic_errors(verdict.manifest)
    assert (not errors) == verdict.expected_from_pydantic, errors


def test_the_crd_needs_kubernetes_1_28() -> None:
    """`fieldPath` in `x-kubernetes-validations` exists from 1.28 (README and chart say so)."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kubernetes_validate.validate(crd(), "1.28", strict=True)
    with pytest.raises(kubernetes_validate.ValidationError, match="fieldPath"):
        kubernetes_validate.validate(crd(), "1.27", strict=True)


# ---------------------------------------------------------------- replay on a real server


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[Any, str]]:
    path = os.environ.get("AGENTPOOL_TEST_KUBECONFIG")
    if not path:
        pytest.skip("AGENTPOOL_TEST_KUBECONFIG is not set: no real API server to replay against")
    from kubernetes import client, config

    api_client = config.new_client_from_config(config_file=path)
    extensions = client.ApiextensionsV1Api(api_client)
    body = crd()
    try:
        current = extensions.read_custom_resource_definition(body["metadata"]["name"])
        body = {
            **body,
            "metadata": {**body["metadata"], "resourceVersion": current.metadata.resource_version},
        }
        extensions.replace_custom_resource_definition(body["metadata"]["name"], body)
    except client.ApiException as exc:
        if exc.status != 404:
            raise
        extensions.create_custom_resource_definition(body)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got = extensions.read_custom_resource_definition(body["metadata"]["name"])
        if any(c.type == "Established" and c.status == "True" for c in got.status.conditions or []):
            break
        time.sleep(0.5)
    yield client.CustomObjectsApi(api_client), os.environ.get("AGENTPOOL_TEST_NAMESPACE", "default")


def _replay(api: Any, namespace: str, verdict: Verdict) -> bool:
    from kubernetes.client import ApiException

    manifest = copy.deepcopy(verdict.manifest)
    manifest["metadata"] = {"name": f"verdict-{uuid.uuid4().hex[:10]}"}
    status = manifest.pop("status", None)
    args = (GROUP, VERSION, namespace, PLURAL)
    try:
        if verdict.write == "create":
            api.create_namespaced_custom_object(
                *args, {**manifest, "status": status} if status else manifest, dry_run="All"
            )
            return True
        created = api.create_namespaced_custom_object(*args, manifest)
        try:
            api.patch_namespaced_custom_object_status(
                *args, manifest["metadata"]["name"], {"status": status}, dry_run="All"
            )
            return True
        finally:
            api.delete_namespaced_custom_object(*args, created["metadata"]["name"])
    except ApiException as exc:
        if exc.status in (400, 422):
            return False
        raise


@pytest.mark.parametrize("verdict", VERDICTS, ids=lambda v: v.name)
def test_a_real_server_agrees(server: tuple[Any, str], verdict: Verdict) -> None:
    api, namespace = server
    assert _replay(api, namespace, verdict) == verdict.accepted
