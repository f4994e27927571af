"""What the planner keeps across restarts (the fitted node models and the records they were fitted
on, the last switch time, the switch count) and what it reports for the pool's status (the
configuration generations in force).

Without it a restarted planner would set every node back to colocated, wait out a new warmup
(30 minutes by default) and split the pool again from the initial split, throwing away the
split it had converged to. With it, a restart resumes from the pods' current roles, and a later
window whose work leaves the range of the saved fitted records refits the nodes as it would have
before the restart (:mod:`agentpool.planner.saved_records`: a few hundred records per node and
phase, 256 KiB at most, under a key of their own).

Where: a ConfigMap ``<pool>-planner-state`` (key ``state.json``) in the pool's namespace, owned by
the pool (garbage-collected with it). Not an annotation on the ``AgentServingPool``: the operator
watches that object, so every save would wake its handlers, annotations share a 256 KiB budget
with everyone else's, and the planner would need write access to the pool. A ConfigMap is the
planner's own object (1 MiB: about 4000 nodes' models, or about 3000 beside the fitted records'
256 KiB), readable with ``kubectl get cm``, and needs only ``get/create/patch`` on configmaps.
Saved after the fit, after every refit and after every switch, so writes are rare.

A saved state is used only if its MoE shape matches the planner's; otherwise (or if it cannot be
parsed) the planner warms up as on a first start.

The same ConfigMap is what the operator reads for the pool's status (no other API access is
needed for it): ``state.json`` counts the planner's switches exactly (:class:`SwitchRecord`,
saved with every switch, so two switches between two status refreshes count as two), and
``loaded.json`` (:class:`LoadedGenerations`) says which pool generation's settings the planner and
each router it polls run, written only when that changes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Literal, Protocol

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentpool.models import MoeShape, NodeModel
from agentpool.models.refit import NodeRecords
from agentpool.planner.kube import MERGE_PATCH
from agentpool.planner.roles import ObjectRef
from agentpool.planner.saved_records import SavedRecords, SavedRecordSet
from agentpool.wire.fits import WireNodeModel

log = logging.getLogger(__name__)

STATE_KEY = "state.json"
RECORDS_KEY = "records.json"  # the fitted records, apart: the operator reads state.json every few seconds
LOADED_KEY = "loaded.json"


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class SavedShape(_Wire):
    experts_active: int = Field(ge=0)
    experts_total: int = Field(ge=0)
    t_fwd: float = Field(gt=0)


SavedNodeModel = WireNodeModel  # one definition of a node's model on the wire and in the state


class SwitchRecord(_Wire):
    """The planner's switches since the pool was created: how many, and the last one (its time,
    wall-clock seconds; the split before and after, e.g. ``3P3D`` -> ``2P4D``; the planner's
    reason, as in its ``PhaseSplitChanged`` Event)."""

    total: int = Field(default=0, ge=0)
    last_at: float | None = None
    last_from: str | None = Field(default=None, max_length=64)
    last_to: str | None = Field(default=None, max_length=64)
    last_reason: str | None = Field(default=None, max_length=1024)


class LoadedGenerations(_Wire):
    """The pool generation whose settings each part runs: the planner (its settings file's
    ``generation``) and each router it polls, by URL (its last work batch's
    ``config_generation``). None: the part's file names no generation."""

    planner: int | None = Field(default=None, ge=0)
    routers: dict[str, int | None] = Field(default_factory=dict)


class PlannerState(_Wire):
    """``fitted_at``, ``last_switch_at`` (applied) and ``last_switch_settled_at`` (the last moved
    node served its new phase; None while one drains) are wall-clock seconds (the planner's clock).
    ``records``: what each node's models were fitted on, thinned; a ConfigMap keeps them under a key
    of their own (``records.json``), so ``state.json`` stays small for the operator, which reads it
    for the status. None in a state saved before they were kept: such a planner refits nothing
    until its next warmup.
    """

    version: Literal[1] = 1
    shape: SavedShape
    fitted_at: float
    last_switch_at: float | None = None
    last_switch_settled_at: float | None = None
    models: dict[str, SavedNodeModel]
    switches: SwitchRecord = SwitchRecord()
    records: dict[str, SavedRecords] = Field(default_factory=dict)

    @staticmethod
    def of(
        shape: MoeShape,
        models: dict[str, NodeModel],
        fitted_at: float,
        last_switch_at: float | None,
        last_switch_settled_at: float | None = None,
        switches: SwitchRecord | None = None,
        records: dict[str, SavedRecords] | None = None,
    ) -> PlannerState:
        """``records``: from :func:`agentpool.planner.saved_records.saved_records` (bounded)."""
        return PlannerState(
            switches=switches if switches is not None else SwitchRecord(),
            records=records or {},
            shape=SavedShape(
                experts_active=shape.experts_active, experts_total=shape.experts_total, t_fwd=shape.t_fwd
            ),
            fitted_at=fitted_at,
            last_switch_at=last_switch_at,
            last_switch_settled_at=last_switch_settled_at,
            models={name: SavedNodeModel.of(m) for name, m in sorted(models.items())},
        )

    def matches(self, shape: MoeShape) -> bool:
        s = self.shape
        return (s.experts_active, s.experts_total, s.t_fwd) == (
            shape.experts_active,
            shape.experts_total,
            shape.t_fwd,
        )

    def node_models(self) -> dict[str, NodeModel]:
        return {name: m.node_model() for name, m in self.models.items()}

    def node_records(self) -> dict[str, NodeRecords]:
        """The saved fitted records of each node that has a model."""
        return {name: r.node_records(name) for name, r in self.records.items() if name in self.models}


class StateStore(Protocol):
    async def load(self) -> PlannerState | None: ...

    async def save(self, state: PlannerState) -> None: ...


class ConfigMapStateStore:
    """The state in ConfigMap ``name`` (key ``state.json``); ``owner`` becomes its owner reference."""

    def __init__(self, api: k8s.ApiClient, namespace: str, name: str, owner: ObjectRef | None = None):
        self._core = k8s.CoreV1Api(api)
        self.namespace = namespace
        self.name = name
        self._owner = owner

    async def load(self) -> PlannerState | None:
        """The saved state; None when there is none or it cannot be read (logged)."""
        try:
            cm = await asyncio.to_thread(self._core.read_namespaced_config_map, self.name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        raw = (cm.data or {}).get(STATE_KEY)
        if raw is None:
            log.info("configmap %s/%s has no %s: no saved state", self.namespace, self.name, STATE_KEY)
            return None
        try:
            state = PlannerState.model_validate_json(raw)
        except ValidationError as e:
            log.warning(
                "saved planner state in %s/%s is not readable, ignored: %s", self.namespace, self.name, e
            )
            return None
        raw = (cm.data or {}).get(RECORDS_KEY)
        try:
            records = {} if raw is None else SavedRecordSet.model_validate_json(raw).nodes
        except ValidationError as e:
            log.warning(
                "saved fitted records are not readable, none restored (no refit until a warmup): %s", e
            )
            records = {}
        return state.model_copy(update={"records": records})

    async def save(self, state: PlannerState) -> None:
        """``state.json`` without the fitted records, ``records.json`` with them, in one patch."""
        records = SavedRecordSet(nodes=state.records).model_dump_json()
        await self._save({STATE_KEY: state.model_dump_json(exclude={"records"}), RECORDS_KEY: records})

    async def save_loaded(self, loaded: LoadedGenerations) -> None:
        """Report which generation each part runs (``loaded.json``; the state is left alone)."""
        await self._save({LOADED_KEY: loaded.model_dump_json()})

    async def _save(self, data: dict[str, str]) -> None:
        """Merge ``data`` into the ConfigMap's (other keys stay), creating it if it is missing."""
        try:
            await asyncio.to_thread(
                self._core.patch_namespaced_config_map,
                self.name,
                self.namespace,
                {"data": data},
                _content_type=MERGE_PATCH,
            )
        except ApiException as e:
            if e.status != 404:
                raise
            await asyncio.to_thread(self._core.create_namespaced_config_map, self.namespace, self._body(data))

    def _body(self, data: dict[str, str]) -> k8s.V1ConfigMap:
        owners = None
        o = self._owner
        if o is not None and o.uid:
            owners = [k8s.V1OwnerReference(api_version=o.api_version, kind=o.kind, name=o.name, uid=o.uid)]
        meta = k8s.V1ObjectMeta(
            name=self.name,
            namespace=self.namespace,
            labels={"app.kubernetes.io/component": "planner"},
            owner_references=owners,
        )
        return k8s.V1ConfigMap(metadata=meta, data=data)
