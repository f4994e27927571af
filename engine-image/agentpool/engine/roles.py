"""Desired role sources and the in-place role switch.

Sources of the desired role (the planner writes it):

- the pod's ``agentpool.io/role`` annotation, read by watching the engine's own pod through the
  Kubernetes API (:class:`KubeRoleWatch`; RBAC: ``get``/``list``/``watch`` pods, limitable to the
  engine's pod names). The engine writes nothing to the API: the role it serves goes to the
  routers in its load reports, and the planner reads it from them;
- a file holding the role (:class:`RoleFileWatch`): a downward-API volume of that annotation in a
  cluster, or a plain file in a local pool.

A value that is not a role is ignored (logged and counted), as is an empty or missing file.

:class:`Switcher` switches in place: stop admitting (queued requests are handed back with
``requeue``), report at once, wait for running work to finish, switch, tell the directory the new
phase, report; the host pool and its index stay. Switch time is measured from the moment the new
desired role was seen: ``drain`` (to drained), ``switch`` (after the drain) and ``total``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from agentpool.engine.errors import SwitchFailed
from agentpool.engine.metrics import EngineMetrics
from agentpool.node import Role

log = logging.getLogger(__name__)

ROLE_ANNOTATION = "agentpool.io/role"
DRAIN_ANNOTATION = "agentpool.io/drain"  # the operator removes this pod: drain for good


def parse_role(text: str | None) -> Role | None:
    if text is None:
        return None
    try:
        return Role(text.strip().lower())
    except ValueError:
        return None


class SwitchableBackend(Protocol):
    @property
    def role(self) -> Role: ...

    @property
    def draining(self) -> bool: ...

    async def wait_drained(self) -> None: ...

    def begin_drain(self) -> None: ...

    async def switch(self, role: Role) -> None: ...


class Switcher:
    def __init__(
        self,
        backend: SwitchableBackend,
        metrics: EngineMetrics,
        on_state: Callable[[], None] = lambda: None,
        on_switched: Callable[[Role], Any] | None = None,
    ) -> None:
        self.backend = backend
        self.metrics = metrics
        self.on_state = on_state  # report now (the reporter's kick)
        self.on_switched = on_switched  # async hook: the directory's phase
        self.desired: Role | None = None
        self.desired_at = 0.0
        self.history: list[dict[str, Any]] = []
        self._changed = asyncio.Event()
        self.switching = False
        self.frozen = False  # the node drains for removal: no more switches

    def set_desired(self, role: Role | None, source: str) -> None:
        if role is None or role == self.desired:
            return
        log.info("desired role %s (from %s)", role, source)
        self.desired = role
        self.desired_at = time.monotonic()
        self._changed.set()

    @property
    def pending(self) -> Role | None:
        """The desired role while it differs from the one served."""
        return self.desired if self.desired is not None and self.desired != self.backend.role else None

    async def run(self) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            if self.pending is not None and not self.frozen:
                await self._switch()

    async def _switch(self) -> None:
        b = self.backend
        t0 = self.desired_at
        old = b.role
        self.switching = True
        self.metrics.draining.set(1)
        b.begin_drain()
        self.on_state()
        await b.wait_drained()
        if self.frozen:  # drained for removal meanwhile: stay drained
            self.switching = False
            return
        t1 = time.monotonic()
        target = self.desired or old  # the latest desired role (it may have changed while draining)
        try:
            await b.switch(target)
        except SwitchFailed as e:  # the backend serves the old role again
            self.switching = False
            self.metrics.draining.set(0)
            self.metrics.switch_failures.labels(old.value, target.value).inc()
            self.history.append({"from": old.value, "to": target.value, "failed": str(e)})
            log.error("switch %s -> %s failed, serving %s: %s", old, target, b.role, e)
            self.on_state()
            return
        if self.on_switched is not None:
            await self.on_switched(target)
        t2 = time.monotonic()
        self.switching = False
        self.metrics.draining.set(0)
        for r in Role:
            self.metrics.role.labels(r.value).set(1 if r == target else 0)
        self.metrics.switch_seconds.labels("drain").observe(t1 - t0)
        self.metrics.switch_seconds.labels("switch").observe(t2 - t1)
        self.metrics.switch_seconds.labels("total").observe(t2 - t0)
        self.metrics.switches.labels(old.value, target.value).inc()
        self.history.append({"from": old.value, "to": target.value, "drain_s": t1 - t0, "total_s": t2 - t0})
        log.info("switched %s -> %s in %.3f s (drain %.3f s)", old, target, t2 - t0, t1 - t0)
        self.on_state()
        if self.pending is not None:
            self._changed.set()


class RoleFileWatch:
    """Polls a file whose content is the desired role."""

    def __init__(self, path: Path, on_role: Callable[[Role | None, str], None], poll_s: float = 0.2) -> None:
        self.path = path
        self.on_role = on_role
        self.poll_s = poll_s
        self.invalid = 0
        self._last: str | None = None

    def read_once(self) -> None:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return
        except OSError as e:
            log.warning("cannot read the role file %s: %s", self.path, e)
            return
        if text == self._last:
            return
        self._last = text
        role = parse_role(text)
        if role is None:
            if text.strip():
                self.invalid += 1
                log.warning("role file %s holds %r, not a role (prefill, decode, both)", self.path, text[:50])
            return
        self.on_role(role, f"file {self.path}")

    async def run(self) -> None:
        while True:
            await asyncio.to_thread(self.read_once)
            await asyncio.sleep(self.poll_s)


class KubeRoleWatch:
    """Watches the engine's own pod; hands each ``agentpool.io/role`` value to ``on_role``.

    The synchronous Kubernetes client runs its watch in a thread; values come back to the event loop
    with ``call_soon_threadsafe``. A failed watch is restarted after ``retry_s``."""

    def __init__(
        self,
        namespace: str,
        pod: str,
        on_role: Callable[[Role | None, str], None],
        kubeconfig: Path | None = None,
        retry_s: float = 1.0,
        read_timeout_s: float = 5.0,
        on_drain: Callable[[], None] | None = None,
    ) -> None:
        self.namespace = namespace
        self.pod = pod
        self.on_role = on_role
        self.kubeconfig = kubeconfig
        self.retry_s = retry_s
        self.read_timeout_s = read_timeout_s
        self.on_drain = on_drain
        self.errors = 0
        self._stop = threading.Event()
        self._api: Any = None

    def _core(self) -> Any:
        if self._api is None:
            from kubernetes import client, config

            # a client of its own: no global default configuration is touched
            if self.kubeconfig is not None:
                api_client = config.new_client_from_config(config_file=str(self.kubeconfig))  # type: ignore[no-untyped-call]
            else:
                conf = client.Configuration()
                config.load_incluster_config(client_configuration=conf)  # type: ignore[no-untyped-call]
                api_client = client.ApiClient(conf)
            self._api = client.CoreV1Api(api_client)
        return self._api

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError, ReadTimeoutError

        while not self._stop.is_set():
            try:
                api = self._core()
                w = watch.Watch()  # type: ignore[no-untyped-call]
                for ev in w.stream(  # type: ignore[no-untyped-call]
                    api.list_namespaced_pod,
                    namespace=self.namespace,
                    field_selector=f"metadata.name={self.pod}",
                    timeout_seconds=30,
                    # a silent watch ends after this on the client side too, so a stop is seen
                    _request_timeout=(5, self.read_timeout_s),
                ):
                    if self._stop.is_set():
                        w.stop()  # type: ignore[no-untyped-call]
                        return
                    pod = ev["object"]
                    if pod.metadata.name != self.pod:  # a server that ignores the field selector
                        continue
                    annotations = pod.metadata.annotations or {}
                    role = parse_role(annotations.get(ROLE_ANNOTATION))
                    if role is not None:
                        loop.call_soon_threadsafe(self.on_role, role, "pod annotation")
                    drain = annotations.get(DRAIN_ANNOTATION)
                    if drain is not None and drain.strip().lower() != "false" and self.on_drain is not None:
                        loop.call_soon_threadsafe(self.on_drain)
            except ReadTimeoutError:
                continue  # nothing happened for a while: watch again
            except (ApiException, HTTPError, OSError, ValueError) as e:
                if self._stop.is_set():
                    return
                self.errors += 1
                log.warning("watch of pod %s/%s failed: %s; retrying", self.namespace, self.pod, e)
                self._stop.wait(self.retry_s)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        thread = threading.Thread(target=self._watch, args=(loop,), name="pod-watch", daemon=True)
        thread.start()
        try:
            await asyncio.Event().wait()  # until cancelled; the daemon thread never blocks an exit
        finally:
            self._stop.set()
            await asyncio.to_thread(thread.join, self.read_timeout_s + 1)

    def stop(self) -> None:
        self._stop.set()
