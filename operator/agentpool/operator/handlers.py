"""Thin kopf handlers over the reconciler: errors mapped to kopf's permanent/temporary classes.

| trigger | handler |
|---|---|
| pool created, changed, or found at operator start | `Reconciler.reconcile` |
| every `status_interval_s` per pool (a daemon) | `Reconciler.refresh_status` (roles, readiness, switches) |
| pool deleted | `Reconciler.cleanup`, then kopf removes its finalizer |

`InvalidPool` -> `kopf.PermanentError` (the status says why; no retry until the pool changes);
`NotYet` -> `kopf.TemporaryError` after its delay; an API error worth retrying ->
`kopf.TemporaryError` with an exponential back-off (1 s doubling to 60 s).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, cast

import kopf
from kubernetes import client as k8s

from agentpool.api import GROUP, PLURAL, VERSION
from agentpool.errors import PermanentError, TemporaryError
from agentpool.operator.kube import KubeError
from agentpool.operator.reconcile import Reconciler

log = logging.getLogger(__name__)
PREFIX = "agentpool.io"
MAX_BACKOFF_S = 60.0


def backoff_s(retry: int) -> float:
    return float(min(MAX_BACKOFF_S, 2.0**retry))


def plain(value: Any) -> Any:
    """kopf's body views as plain dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def post_event(body: Mapping[str, Any], reason: str, message: str, warning: bool = False) -> None:
    """An Event about the pool. `kopf.event`, not `kopf.info`: that one is dropped below
    `settings.posting.level` (WARNING here, for kopf's own log lines), and so would every Normal
    Event of ours be."""
    kopf.event(
        cast(kopf.Body, body), type="Warning" if warning else "Normal", reason=reason, message=message[:1024]
    )


def connection_info(config: k8s.Configuration) -> kopf.ConnectionInfo:
    """kopf's credentials from the same client configuration the operator's own calls use."""
    header = config.get_api_key_with_prefix("BearerToken") or config.get_api_key_with_prefix("authorization")
    parts = header.split(" ", 1) if header else []
    scheme, token = (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0] if parts else None)
    return kopf.ConnectionInfo(
        server=config.host,
        ca_path=config.ssl_ca_cert,
        insecure=not config.verify_ssl,
        scheme=scheme,
        token=token,
        certificate_path=config.cert_file,
        private_key_path=config.key_file,
    )


def build_registry(
    reconciler: Reconciler, config: k8s.Configuration, status_interval_s: float
) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = f"{PREFIX}/cleanup"
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=PREFIX)
        settings.posting.level = logging.WARNING  # kopf's own log lines; ours are posted explicitly

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(config)

    @kopf.on.resume(GROUP, VERSION, PLURAL, registry=registry)
    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)
    @kopf.on.update(GROUP, VERSION, PLURAL, registry=registry)
    async def reconcile(body: kopf.Body, retry: int, **_: Any) -> None:
        try:
            await reconciler.reconcile(plain(body))
        except KubeError as exc:  # first: an API error of any kind is retried (a 404 or 409 too)
            post_event(plain(body), "ReconcileFailed", f"will retry: {exc}", warning=True)
            raise kopf.TemporaryError(f"Kubernetes API: {exc}", delay=backoff_s(retry)) from exc
        except PermanentError as exc:  # InvalidPool: the status says why; no retry until the pool changes
            raise kopf.PermanentError(str(exc)) from exc
        except TemporaryError as exc:  # NotYet: retry after its delay
            delay = backoff_s(retry) if exc.retry_after_s is None else exc.retry_after_s
            raise kopf.TemporaryError(str(exc), delay=delay) from exc

    @kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry)
    async def delete(body: kopf.Body, retry: int, **_: Any) -> None:
        try:
            removed = await reconciler.cleanup(plain(body))
        except KubeError as exc:
            raise kopf.TemporaryError(f"Kubernetes API: {exc}", delay=backoff_s(retry)) from exc
        log.info("pool %s deleted: removed %s", body.get("metadata", {}).get("name"), ", ".join(removed))

    @kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=2.0, registry=registry)
    async def refresh(body: kopf.Body, stopped: kopf.DaemonStopped, **_: Any) -> None:
        while not stopped:
            try:
                await reconciler.refresh_status(plain(body))
            except KubeError as exc:
                name = body.get("metadata", {}).get("name")
                log.warning("status refresh of %s failed (next in %.1f s): %s", name, status_interval_s, exc)
            await stopped.wait(status_interval_s)

    return registry
