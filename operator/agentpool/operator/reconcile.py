"""Reconciling one pool: children applied idempotently, roles, drains, status, cleanup (the I/O shell
around the pure builders and status).

- Apply: every child is compared with the cluster's copy and written only if it differs
  (`apply.apply_child`); generated Secrets are created once and never rewritten.
- Roles: an engine pod without `agentpool.io/role` gets its initial role from `initialSplit`
  (ordinal order); a pod that has one is never touched, so the planner's decisions stand.
- Scale-down: the ConfigMap first drops the leaving engines from the router's node list, the
  leaving pods get `agentpool.io/drain` (the engine stops admitting work, hands its queue back and
  finishes what runs, then reports unready), and only when they are drained (unready or gone, or
  after `drain_timeout_s`) does the StatefulSet shrink.
- Status: computed by `status.pool_status` from what `observe` read; written only when it differs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from pydantic import ValidationError

from agentpool.api import AgentServingPool, AgentServingPoolSpec, AgentServingPoolStatus
from agentpool.operator.apply import (
    ApplyReport,
    Outcome,
    apply_child,
    child_key,
    delete_if_owned,
    merge_patch_between,
)
from agentpool.operator.builders import BuildSettings, InvalidPoolError, children
from agentpool.operator.builders.config import role_for_pod
from agentpool.operator.builders.network import policy_names
from agentpool.operator.builders.secrets import (
    generated_secret,
    generated_secret_keys,
    missing_keys,
    new_secret_values,
)
from agentpool.operator.errors import InvalidPool, NotYet
from agentpool.operator.kube import KubeApi, KubeInvalid
from agentpool.operator.names import DRAIN_ANNOTATION, ENGINE, PLANNER, ROLE_ANNOTATION, PoolRef
from agentpool.operator.observe import engine_pods, observe
from agentpool.operator.status import invalid_status, pool_status

log = logging.getLogger(__name__)


class EventSink(Protocol):
    """Where Kubernetes Events about a pool go (kopf's poster in the operator)."""

    def __call__(self, body: Mapping[str, Any], reason: str, message: str, warning: bool = False) -> None: ...


@dataclass(frozen=True, slots=True)
class Parsed:
    ref: PoolRef
    generation: int
    spec: AgentServingPoolSpec | None
    problem: str | None
    status: AgentServingPoolStatus | None


def _pool_ref(body: Mapping[str, Any]) -> PoolRef:
    meta = body["metadata"]
    return PoolRef(
        str(meta["name"]), str(meta["namespace"]), str(meta["uid"]), dict(meta.get("labels") or {})
    )


def parse(body: Mapping[str, Any]) -> Parsed:
    """The pool from its body: spec validated by pydantic (as the CRD would) and deeper."""
    ref, generation = _pool_ref(body), int(body["metadata"].get("generation") or 1)
    previous: AgentServingPoolStatus | None = None
    try:
        previous = AgentServingPoolStatus.model_validate(
            {k: v for k, v in (body.get("status") or {}).items() if k != "kopf"}
        )
    except ValidationError:
        previous = None
    try:
        pool = AgentServingPool.model_validate({**body, "status": None, "metadata": {}})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        return Parsed(ref, generation, None, f"invalid spec: {problems}", previous)
    return Parsed(ref, generation, pool.spec, None, previous)


class Reconciler:
    def __init__(
        self,
        api: KubeApi,
        settings: BuildSettings,
        token: Callable[[], str],
        events: EventSink,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        drain_timeout_s: float = 300.0,
        drain_poll_s: float = 5.0,
    ) -> None:
        self.api = api
        self.settings = settings
        self.token = token
        self.events = events
        self.clock = clock
        self.drain_timeout_s = drain_timeout_s
        self.drain_poll_s = drain_poll_s
        self._locks: dict[str, asyncio.Lock] = {}

    def _lock(self, body: Mapping[str, Any]) -> asyncio.Lock:
        """One writer of a pool's children and status at a time (reconcile, or a refresh)."""
        return self._locks.setdefault(str(body["metadata"]["uid"]), asyncio.Lock())

    # ------------------------------------------------------------ reconcile

    async def reconcile(self, body: Mapping[str, Any]) -> ApplyReport:
        """Apply the pool's children; `InvalidPool` (status already says why) or `NotYet`."""
        async with self._lock(body):
            return await self._reconcile(body)

    async def _reconcile(self, body: Mapping[str, Any]) -> ApplyReport:
        parsed = parse(body)
        if parsed.spec is None:
            await self._invalid(body, parsed, parsed.problem or "invalid spec")
            raise InvalidPool(parsed.problem or "invalid spec")
        ref, spec = parsed.ref, parsed.spec
        started = time.monotonic()
        try:
            desired = children(ref, spec, parsed.generation, self.settings)
        except InvalidPoolError as exc:
            await self._invalid(body, parsed, str(exc))
            raise InvalidPool(str(exc)) from exc
        report = ApplyReport()
        await self._secrets(ref, spec, report)
        draining = await self._scale_down(ref, spec, desired)
        try:
            for obj in desired:
                report.outcomes[child_key(obj)] = await apply_child(self.api, obj)
        except KubeInvalid as exc:
            message = f"the API server refused a child: {exc}"
            await self._invalid(body, parsed, message)
            raise InvalidPool(message) from exc
        await self._prune_policies(ref, desired, report)
        log.info(
            "pool %s/%s: children applied in %.2f s", ref.namespace, ref.name, time.monotonic() - started
        )
        await self.give_roles(ref, spec, parsed.status)
        created = [k for k, o in report.outcomes.items() if o is Outcome.CREATED]
        updated = [k for k, o in report.outcomes.items() if o is Outcome.UPDATED]
        deleted = [k for k, o in report.outcomes.items() if o is Outcome.DELETED]
        if created:
            self.events(body, "Created", f"created {len(created)} objects: {', '.join(created)}")
        if updated:
            self.events(body, "Updated", f"generation {parsed.generation}: updated {', '.join(updated)}")
        if deleted:
            self.events(body, "Deleted", f"generation {parsed.generation}: deleted {', '.join(deleted)}")
        # a generation counts as observed once it is fully applied (not while engines drain)
        done = None if draining else parsed.generation
        if draining:
            done = parsed.status.observed_generation if parsed.status is not None else None
        await self._refresh(
            body,
            observed_generation=done,
            draining=draining,
            children_changed=bool(report.changed),
            explicit=True,
        )
        log.info("pool %s/%s: generation %d reconciled in %.2f s", ref.namespace, ref.name, parsed.generation,
                 time.monotonic() - started)  # fmt: skip
        if draining:
            raise NotYet(
                f"waiting for {', '.join(draining)} to drain before removing them", self.drain_poll_s
            )
        return report

    async def _secrets(self, ref: PoolRef, spec: AgentServingPoolSpec, report: ApplyReport) -> None:
        for name, keys in generated_secret_keys(ref, spec).items():
            key = f"Secret/{name}"
            existing = await self.api.get("Secret", ref.namespace, name)
            if existing is not None:
                missing = missing_keys(existing, keys)
                if missing:  # only the keys it lacks: the values it holds are never rotated
                    patch = {"stringData": new_secret_values(missing, self.token)}
                    await self.api.merge_patch("Secret", ref.namespace, name, patch)
                report.outcomes[key] = Outcome.UPDATED if missing else Outcome.UNCHANGED
                continue
            await self.api.create(generated_secret(ref, name, "auth", new_secret_values(keys, self.token)))
            report.outcomes[key] = Outcome.CREATED

    async def _prune_policies(self, ref: PoolRef, desired: list[dict[str, Any]], report: ApplyReport) -> None:
        """Delete the pool's NetworkPolicies it no longer wants (`spec.network.policy: false`)."""
        wanted = {o["metadata"]["name"] for o in desired if o["kind"] == "NetworkPolicy"}
        for name in policy_names(ref):
            if name not in wanted and await delete_if_owned(
                self.api, "NetworkPolicy", ref.namespace, name, ref.uid
            ):
                report.outcomes[f"NetworkPolicy/{name}"] = Outcome.DELETED

    async def _scale_down(
        self, ref: PoolRef, spec: AgentServingPoolSpec, desired: list[dict[str, Any]]
    ) -> tuple[str, ...]:
        """Keep the engines a scale-down removes until they drained; returns those still draining."""
        current = await self.api.get("StatefulSet", ref.namespace, ref.child(ENGINE))
        replicas = int(((current or {}).get("spec") or {}).get("replicas") or 0)
        if replicas <= spec.nodes:
            return ()
        leaving = [ref.engine_pod(i) for i in range(spec.nodes, replicas)]
        pods = await engine_pods(self.api, ref)
        now = self.clock()
        waiting: list[str] = []
        for name in leaving:
            pod = pods.get(name)
            if pod is None:
                continue
            notes = pod["metadata"].get("annotations") or {}
            started = notes.get(DRAIN_ANNOTATION)
            if started is None:
                await self.api.merge_patch(
                    "Pod",
                    ref.namespace,
                    name,
                    {"metadata": {"annotations": {DRAIN_ANNOTATION: now.isoformat()}}},
                )
                waiting.append(name)
                continue
            ready = any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (pod.get("status") or {}).get("conditions") or []
            )
            try:
                overdue = now - datetime.fromisoformat(started) > timedelta(seconds=self.drain_timeout_s)
            except ValueError:
                overdue = True
            if ready and not overdue:
                waiting.append(name)
        if not waiting:
            return ()
        # still draining: the StatefulSet and the pod permissions keep the leaving engines for now
        keep = spec.model_copy(update={"nodes": replicas})
        kept = {child_key(o): o for o in children(ref, keep, 0, self.settings)}
        for i, obj in enumerate(desired):
            if obj["kind"] in ("StatefulSet", "Role") and obj["metadata"]["name"] in (
                ref.child(ENGINE),
                ref.child(PLANNER),
            ):
                desired[i] = kept[child_key(obj)]
        return tuple(waiting)

    async def give_roles(
        self, ref: PoolRef, spec: AgentServingPoolSpec, previous: AgentServingPoolStatus | None
    ) -> list[str]:
        """Give pods without a desired role one (:func:`role_for_pod`: the role the status last showed
        for a replaced pod, else the initial one); never change a role that is set."""
        set_now: list[str] = []
        for name, pod in sorted((await engine_pods(self.api, ref)).items()):
            notes = pod["metadata"].get("annotations") or {}
            ordinal = name.rsplit("-", 1)[-1]
            if ROLE_ANNOTATION in notes or not ordinal.isdigit() or int(ordinal) >= spec.nodes:
                continue
            role = role_for_pod(spec, int(ordinal), name, previous)
            await self.api.merge_patch(
                "Pod", ref.namespace, name, {"metadata": {"annotations": {ROLE_ANNOTATION: role}}}
            )
            set_now.append(f"{name}={role}")
        return set_now

    # ------------------------------------------------------------ status

    async def _invalid(self, body: Mapping[str, Any], parsed: Parsed, message: str) -> None:
        status = invalid_status(message, parsed.generation, parsed.status, self.clock())
        if await self._write_status(parsed, body, status):
            self.events(body, "InvalidSpec", message, warning=True)

    async def refresh_status(self, body: Mapping[str, Any]) -> bool:
        """The periodic refresh: re-reads the pool, recomputes its status, writes it if it changed."""
        async with self._lock(body):
            meta = body["metadata"]
            current = await self.api.get("AgentServingPool", str(meta["namespace"]), str(meta["name"]))
            if current is None or current["metadata"].get("deletionTimestamp"):
                return False
            return await self._refresh(current)

    async def _refresh(
        self,
        body: Mapping[str, Any],
        observed_generation: int | None = None,
        draining: tuple[str, ...] = (),
        children_changed: bool = False,
        explicit: bool = False,
    ) -> bool:
        """Recompute the status; write it only if it changed. True if it was written. A periodic
        refresh (`explicit=False`) keeps the observed generation and leaves alone a status that a
        reconcile owns for now (an invalid generation, or engines draining)."""
        parsed = parse(body)
        if parsed.spec is None:
            return False
        if parsed.status is not None and not explicit:
            observed_generation = parsed.status.observed_generation
            degraded = next((c for c in parsed.status.conditions if c.type == "Degraded"), None)
            if (
                degraded is not None
                and degraded.reason == "InvalidSpec"
                and observed_generation == parsed.generation
            ):
                return False  # the reconcile found this generation invalid; it stays so until edited
        if parsed.status is not None and not explicit:
            progressing = next((c for c in parsed.status.conditions if c.type == "Progressing"), None)
            if (
                progressing is not None
                and progressing.reason == "Draining"
                and observed_generation != parsed.generation
            ):
                return False  # a reconcile is waiting for drains; it refreshes the status itself
        await self.give_roles(parsed.ref, parsed.spec, parsed.status)
        observed = await observe(self.api, parsed.ref, parsed.spec, draining, children_changed)
        names = [parsed.ref.engine_pod(i) for i in range(parsed.spec.nodes)]
        status = pool_status(
            names, parsed.spec, parsed.generation, observed_generation, observed, parsed.status, self.clock()
        )
        before = parsed.status.switches.total if parsed.status and parsed.status.switches else 0
        written = await self._write_status(parsed, body, status)
        if written and status.switches is not None and status.switches.total > before:
            s = status.switches
            more = s.total - before
            self.events(
                body,
                "PhaseSplitSwitched",
                f"{s.last_from} -> {s.last_to}: {s.last_reason or 'planner decision'}"
                + (f" (the last of {more} switches since the previous status)" if more > 1 else ""),
            )
        return written

    async def _write_status(
        self, parsed: Parsed, body: Mapping[str, Any], status: AgentServingPoolStatus
    ) -> bool:
        new = status.to_wire()
        old = {k: v for k, v in (body.get("status") or {}).items() if k != "kopf"}
        if old == new:
            return False
        patch = merge_patch_between(old, new)
        await self.api.merge_patch(
            "AgentServingPool", parsed.ref.namespace, parsed.ref.name, {"status": patch}, "status"
        )
        return True

    # ------------------------------------------------------------ delete

    async def cleanup(self, body: Mapping[str, Any]) -> list[str]:
        """Delete everything the pool made (owner references would too, later; this is now)."""
        ref = _pool_ref(body)
        parsed = parse(body)
        removed: list[str] = []
        spec = parsed.spec
        made: list[tuple[str, str]] = []
        if spec is not None:
            try:
                made = [(o["kind"], o["metadata"]["name"]) for o in children(ref, spec, 0, self.settings)]
            except InvalidPoolError:
                made = []
            made += [("Secret", name) for name in generated_secret_keys(ref, spec)]
        made = [m for m in made if m[0] != "NetworkPolicy"]
        made += [("ConfigMap", ref.planner_state), ("Lease", ref.planner_lease)]
        for kind, name in reversed(made):
            if await self.api.delete(kind, ref.namespace, name):
                removed.append(f"{kind}/{name}")
        for name in policy_names(ref):  # last, after the pods they protect; made by this pool only
            if await delete_if_owned(self.api, "NetworkPolicy", ref.namespace, name, ref.uid):
                removed.append(f"NetworkPolicy/{name}")
        return removed
