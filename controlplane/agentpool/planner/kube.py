"""The planner's Kubernetes writes: desired-role annotations on engine pods, and Events.

Client choice: the synchronous ``kubernetes`` client, each call run in a worker thread
(``asyncio.to_thread``), so the event loop never blocks. It is already a dependency, and it
brings kubeconfig and in-cluster authentication and TLS handling that a hand-written aiohttp
client would have to repeat. The planner makes one list and a few patches per window (minutes
apart), so a thread per call costs nothing that matters.

The planner is the only writer of engine pods, and it writes only two annotations (JSON merge
patches that touch no other field) and creates core/v1 Events (the role seam, and what a local
pool uses instead, is :mod:`agentpool.planner.roles`):

- ``agentpool.io/role`` (read and written): the desired role (``prefill``, ``decode``; ``both``
  while colocated);
- ``agentpool.io/role-pinned`` (read): any value except ``"false"`` pins the pod; the planner never
  changes a pinned pod's role (a typo therefore pins rather than unpins);
- ``agentpool.io/observed-role`` (written only): the role the engine serves, as the routers report
  it (:class:`agentpool.planner.roles.ServedRoles`), copied onto the pod for the operator's status
  and ``kubectl``. The planner itself never reads it back: while the routers' served role differs
  from the desired role, or no router has heard from the engine, the node counts as draining.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import uuid

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from agentpool.planner.roles import (
    OBSERVED_ROLE_ANNOTATION,
    PINNED_ANNOTATION,
    ROLE_ANNOTATION,
    ObjectRef,
    PodRoleState,
    ServedRoles,
)
from agentpool.wire.urls import base_url

MERGE_PATCH = "application/merge-patch+json"
log = logging.getLogger(__name__)


class PodRoles:
    """The :class:`agentpool.planner.roles.RoleBoard` of a cluster: reads engine pods' role
    annotations, patches desired roles, records Events."""

    def __init__(
        self,
        api: k8s.ApiClient,
        namespace: str,
        label_selector: str,
        served: ServedRoles,
        component: str = "agentpool-planner",
    ):
        self._core = k8s.CoreV1Api(api)
        self._namespace = namespace
        self._selector = label_selector
        self._served = served
        self._component = component

    @property
    def namespace(self) -> str:
        return self._namespace

    async def pods(self) -> list[PodRoleState]:
        """The engine pods that match the pool's label selector, by name, with the role each
        serves from the routers; a served role the pod's ``agentpool.io/observed-role`` does not
        show yet is copied onto it."""
        pods = await asyncio.to_thread(
            self._core.list_namespaced_pod, namespace=self._namespace, label_selector=self._selector
        )
        states = []
        for p in pods.items:
            if p.metadata is None:
                continue
            name = str(p.metadata.name)
            served = self._served.get(name)
            states.append(PodRoleState.of(name, p.metadata.annotations, served))
            if served is not None and (p.metadata.annotations or {}).get(OBSERVED_ROLE_ANNOTATION) != served:
                await self._publish_observed(name, served)
        return sorted(states, key=lambda s: s.name)

    async def _publish_observed(self, pod: str, role: str) -> None:
        """Show the served role on the pod (for the operator's status); a failure is logged only:
        the planner's decisions do not depend on it, and the next listing tries again."""
        try:
            await self._patch_annotation(pod, OBSERVED_ROLE_ANNOTATION, role)
        except ApiException as e:
            log.warning("observed role of pod %s not shown (%s %s)", pod, e.status, e.reason)

    async def set_role(self, pod: str, role: str) -> None:
        """Merge-patch the desired-role annotation of ``pod``; nothing else on the pod changes."""
        await self._patch_annotation(pod, ROLE_ANNOTATION, role)

    async def _patch_annotation(self, pod: str, key: str, value: str) -> None:
        """Merge-patch one annotation of ``pod`` (the only pod write the planner's Role allows)."""
        body = {"metadata": {"annotations": {key: value}}}
        await asyncio.to_thread(
            self._core.patch_namespaced_pod,
            name=pod,
            namespace=self._namespace,
            body=body,
            _content_type=MERGE_PATCH,
        )

    async def record_event(self, about: ObjectRef, reason: str, message: str, warning: bool = False) -> None:
        """Create a core/v1 Event about ``about`` (message cut to the API's 1 KiB limit)."""
        now = dt.datetime.now(tz=dt.UTC)
        event = k8s.CoreV1Event(
            metadata=k8s.V1ObjectMeta(
                name=f"{about.name}.planner.{uuid.uuid4().hex[:12]}", namespace=about.namespace
            ),
            involved_object=k8s.V1ObjectReference(
                api_version=about.api_version,
                kind=about.kind,
                name=about.name,
                namespace=about.namespace,
                uid=about.uid,
            ),
            reason=reason,
            message=message[:1024],
            type="Warning" if warning else "Normal",
            source=k8s.V1EventSource(component=self._component),
            reporting_component=self._component,
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        await asyncio.to_thread(self._core.create_namespaced_event, namespace=about.namespace, body=event)


__all__ = [
    "MERGE_PATCH",
    "OBSERVED_ROLE_ANNOTATION",
    "PINNED_ANNOTATION",
    "ROLE_ANNOTATION",
    "ObjectRef",
    "PodRoleState",
    "PodRoles",
    "RouterPods",
    "ServedRoles",
]


class RouterPods:
    """The router replicas of a pool: the running pods matching ``label_selector``, as base URLs
    ``<scheme>://<pod IP>:<port>``. The planner polls each one's work log and pushes models to each."""

    def __init__(
        self, api: k8s.ApiClient, namespace: str, label_selector: str, port: int, scheme: str = "http"
    ) -> None:
        if scheme not in ("http", "https"):
            raise ValueError(f"routers are reached over http or https, not {scheme!r}")
        self._scheme = scheme
        self._core = k8s.CoreV1Api(api)
        self._namespace = namespace
        self._selector = label_selector
        self._port = port

    async def urls(self) -> list[str] | None:
        """The replicas' URLs by pod name; None when the API did not answer (logged)."""
        try:
            pods = await asyncio.to_thread(
                self._core.list_namespaced_pod, namespace=self._namespace, label_selector=self._selector
            )
        except ApiException as e:
            log.warning("router pods not listed (%s %s): keeping the routers known", e.status, e.reason)
            return None
        out: list[tuple[str, str]] = []
        for p in pods.items:
            meta, status = p.metadata, p.status
            if meta is None or status is None or meta.deletion_timestamp is not None:
                continue
            ip = status.pod_ip
            if status.phase != "Running" or not ip:
                continue
            out.append((str(meta.name), base_url(self._scheme, ip, self._port)))
        return [url for _, url in sorted(out)]
