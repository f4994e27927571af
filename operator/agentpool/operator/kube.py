"""The operator's Kubernetes calls: a small REST layer over the `kubernetes` client.

Client choice: the synchronous `kubernetes` client (already a dependency; kubeconfig and in-cluster
authentication, TLS), each call in a worker thread (`asyncio.to_thread`) so the event loop never
blocks; the planner does the same. Calls go through `ApiClient.call_api` with paths from a table
of the kinds the operator touches, so one code path serves every kind. Errors become the
operator's own: `KubeNotFound`, `KubeConflict`, `KubeInvalid` (the server refused the object:
permanent) and `KubeUnavailable` (anything worth retrying).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from agentpool.api import GROUP, PLURAL, VERSION
from agentpool.errors import (
    AgentpoolError,
    ConflictError,
    InvalidInputError,
    NotFoundError,
    UnavailableError,
)

FIELD_MANAGER = "agentpool-operator"
APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True, slots=True)
class Kind:
    prefix: str
    """`/api/v1` or `/apis/<group>/<version>`."""
    plural: str


KINDS: Mapping[str, Kind] = {
    "ConfigMap": Kind("/api/v1", "configmaps"),
    "Secret": Kind("/api/v1", "secrets"),
    "Service": Kind("/api/v1", "services"),
    "ServiceAccount": Kind("/api/v1", "serviceaccounts"),
    "Pod": Kind("/api/v1", "pods"),
    "Event": Kind("/api/v1", "events"),
    "StatefulSet": Kind("/apis/apps/v1", "statefulsets"),
    "Deployment": Kind("/apis/apps/v1", "deployments"),
    "Role": Kind("/apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": Kind("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "Lease": Kind("/apis/coordination.k8s.io/v1", "leases"),
    "NetworkPolicy": Kind("/apis/networking.k8s.io/v1", "networkpolicies"),
    "AgentServingPool": Kind(f"/apis/{GROUP}/{VERSION}", PLURAL),
}


class KubeError(AgentpoolError):
    """A Kubernetes API call failed; each subclass is the kind of its HTTP status (the root table)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class KubeNotFound(KubeError, NotFoundError):
    """404: the object does not exist."""


class KubeConflict(KubeError, ConflictError):
    """409: it exists already, or it changed since it was read."""


class KubeInvalid(KubeError, InvalidInputError):
    """400/422: the server refuses the object as written; retrying will not help."""


class KubeUnavailable(KubeError, UnavailableError):
    """Anything else (5xx, 429, 403, connection errors): worth retrying later."""


_BY_STATUS: Mapping[int, type[KubeError]] = {
    404: KubeNotFound,
    409: KubeConflict,
    400: KubeInvalid,
    422: KubeInvalid,
}


def _error(status: int, body: Any, reason: str | None) -> KubeError:
    detail = reason or ""
    try:
        parsed = json.loads(body) if body else {}
        detail = str(parsed.get("message") or detail)
    except (ValueError, TypeError, AttributeError):
        pass
    return _BY_STATUS.get(status, KubeUnavailable)(f"{status} {detail}".strip(), status)


class KubeApi:
    """Namespaced object calls by kind; every method runs the blocking client in a thread."""

    def __init__(self, api_client: k8s.ApiClient, timeout_s: float = 30.0) -> None:
        self._client = api_client
        self._timeout_s = timeout_s

    @staticmethod
    def path(kind: str, namespace: str, name: str | None = None, subresource: str | None = None) -> str:
        k = KINDS[kind]
        out = f"{k.prefix}/namespaces/{namespace}/{k.plural}"
        if name is not None:
            out += f"/{name}"
        if subresource is not None:
            out += f"/{subresource}"
        return out

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        try:
            verb, url, headers, payload, form = self._client.param_serialize(
                method=method,
                resource_path=path,
                query_params=query or [],
                header_params={"Content-Type": content_type, "Accept": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self._client.call_api(
                verb,
                url,
                header_params=headers,
                body=payload,
                post_params=form,
                _request_timeout=self._timeout_s,
            )
            data = response.read()  # type: ignore[no-untyped-call]
        except ApiException as exc:
            raise _error(int(exc.status or 0), exc.body, exc.reason) from exc
        except HTTPError as exc:
            raise KubeUnavailable(f"cannot reach the Kubernetes API: {exc}") from exc
        if response.status >= 400:
            raise _error(response.status, data, response.reason)
        return cast(dict[str, Any], json.loads(data)) if data else {}

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await asyncio.to_thread(self._call, "GET", self.path(kind, namespace, name))
        except KubeNotFound:
            return None

    async def list_objects(
        self, kind: str, namespace: str, labels: Mapping[str, str]
    ) -> list[dict[str, Any]]:
        """Objects whose labels include `labels` (filtered here too: not every server filters)."""
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        found = await asyncio.to_thread(
            self._call, "GET", self.path(kind, namespace), query=[("labelSelector", selector)]
        )
        items: list[dict[str, Any]] = found.get("items") or []
        return [
            item
            for item in items
            if all((item.get("metadata", {}).get("labels") or {}).get(k) == v for k, v in labels.items())
        ]

    async def list_events(self, namespace: str, involved: str) -> list[dict[str, Any]]:
        """core/v1 Events about the object named `involved` (filtered here too)."""
        found = await asyncio.to_thread(
            self._call,
            "GET",
            self.path("Event", namespace),
            query=[("fieldSelector", f"involvedObject.name={involved}")],
        )
        items: list[dict[str, Any]] = found.get("items") or []
        return [e for e in items if (e.get("involvedObject") or {}).get("name") == involved]

    async def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        path = self.path(obj["kind"], meta["namespace"])
        return await asyncio.to_thread(self._call, "POST", path, dict(obj), [("fieldManager", FIELD_MANAGER)])

    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply with the operator's field manager (it takes over conflicting fields it
        sets; fields other managers own and it does not set stay as they are)."""
        meta = obj["metadata"]
        path = self.path(obj["kind"], meta["namespace"], meta["name"])
        query = [("fieldManager", FIELD_MANAGER), ("force", "true")]
        return await asyncio.to_thread(self._call, "PATCH", path, dict(obj), query, APPLY_PATCH)

    async def merge_patch(
        self, kind: str, namespace: str, name: str, patch: Mapping[str, Any], subresource: str | None = None
    ) -> dict[str, Any]:
        path = self.path(kind, namespace, name, subresource)
        query = [("fieldManager", FIELD_MANAGER)]
        return await asyncio.to_thread(self._call, "PATCH", path, dict(patch), query, MERGE_PATCH)

    async def delete(self, kind: str, namespace: str, name: str) -> bool:
        """Delete (its own children follow in the background); False if it was gone already."""
        body = {"propagationPolicy": "Background"}
        try:
            await asyncio.to_thread(self._call, "DELETE", self.path(kind, namespace, name), body)
        except KubeNotFound:
            return False
        return True
