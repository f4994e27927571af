"""`AgentServingPool` status: what the operator and planner observed, written by the operator."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal, get_args

from pydantic import Field, Strict, field_validator

from agentpool.api.base import ApiModel
from agentpool.kv import Role

ConditionType = Literal["Ready", "Progressing", "Degraded"]
CONDITION_TYPES: tuple[str, ...] = get_args(ConditionType)
ROLES: tuple[str, ...] = tuple(r.value for r in Role)
RoleField = Annotated[Role, Strict(False)]
"""agentpool's one :class:`~agentpool.kv.Role`, read from its string (the status comes from the API
server as JSON, and the operator writes the annotations' strings); the CRD lists its values."""

CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


class Reason(StrEnum):
    """Reasons the operator sets on conditions (`Ready`, `Progressing`, `Degraded`)."""

    ALL_NODES_SERVING = "AllNodesServing"
    """Ready=True: every node serves its desired role and the control plane answers."""
    NODES_STARTING = "NodesStarting"
    """Ready=False / Progressing=True: engine pods are being created or are not ready yet."""
    RECONCILING = "Reconciling"
    """Progressing=True: the operator is applying a spec change to the children."""
    LEARNING = "Learning"
    """Progressing=True: the planner's warmup, fitting the iteration models in colocated mode."""
    SWITCHING = "Switching"
    """Progressing=True: nodes are switching phase after a planner decision."""
    DRAINING = "Draining"
    """Progressing=True: engines that a scale-down removes finish their work before they go."""
    CONFIG_LOADING = "ConfigLoading"
    """Progressing=True: the router or the planner still runs an older generation's settings."""
    CONTROL_PLANE_STARTING = "ControlPlaneStarting"
    """Ready=False: the router or the KV directory is not available yet."""
    STABLE = "Stable"
    """Progressing=False: nothing to change."""
    HEALTHY = "Healthy"
    """Degraded=False."""
    INVALID_SPEC = "InvalidSpec"
    """Degraded=True: the spec cannot be served as written (the message says why); no retry."""
    ENGINE_FAILING = "EngineFailing"
    """Degraded=True: engine pods crash or stay unready."""
    REDIS_UNAVAILABLE = "RedisUnavailable"
    """Degraded=True: the directory cannot reach Redis."""
    DIRECTORY_UNAVAILABLE = "DirectoryUnavailable"
    """Degraded=True: the router or engines cannot reach the KV directory."""


class Condition(ApiModel):
    """A standard Kubernetes condition."""

    type: ConditionType
    """`Ready`, `Progressing` or `Degraded`."""
    status: Literal["True", "False", "Unknown"]
    """`True`, `False` or `Unknown`."""
    reason: str = Field(pattern=CONDITION_REASON_PATTERN, min_length=1, max_length=1024)
    """CamelCase reason; the operator uses the values of `agentpool.api.Reason`."""
    message: str = Field(default="", max_length=32768)
    """Human-readable detail."""
    last_transition_time: datetime | None = Field(default=None, strict=False)
    """When `status` last changed."""
    observed_generation: int | None = Field(default=None, ge=0)
    """`metadata.generation` the condition was computed for."""


class SplitStatus(ApiModel):
    """Nodes per role now."""

    prefill: int = Field(ge=0)
    """Nodes serving prefill."""
    decode: int = Field(ge=0)
    """Nodes serving decode."""
    colocated: int = Field(default=0, ge=0)
    """Nodes serving both phases (a colocated pool, or every node during the planner's warmup)."""
    label: str = Field(max_length=64)
    """Short form shown by `kubectl get`: `4P5D`, or `9C` when colocated."""


class NodeStatus(ApiModel):
    """One engine node."""

    name: str = Field(min_length=1, max_length=253)
    """Engine pod name."""
    desired_role: RoleField
    """Role the planner set (pod annotation `agentpool.io/role`)."""
    observed_role: RoleField | None = None
    """Role the engine reports serving; differs from the desired role while it switches."""
    ready: bool = False
    """Whether the engine serves requests."""


class SwitchStatus(ApiModel):
    """Phase switches the planner has made."""

    total: int = Field(default=0, ge=0)
    """Switch decisions since the pool was created, as the planner counts them (each one, however
    close together)."""
    last_time: datetime | None = Field(default=None, strict=False)
    """When the last switch was decided."""
    last_from: str | None = Field(default=None, max_length=64)
    """Split before the last switch, e.g. `6P3D`."""
    last_to: str | None = Field(default=None, max_length=64)
    """Split after the last switch, e.g. `4P5D`."""
    last_reason: str | None = Field(default=None, max_length=1024)
    """The planner's reason for the last switch (its `PhaseSplitChanged` Event)."""


class LoadedConfig(ApiModel):
    """Which generation's settings the replicas of one part run."""

    loaded_generation: int | None = Field(default=None, ge=0)
    """The oldest generation any replica runs (None: none has reported one yet)."""
    newest_generation: int | None = Field(default=None, ge=0)
    """The newest generation any replica runs."""
    replicas: int = Field(default=0, ge=0)
    """Replicas that reported."""


class ConfigStatus(ApiModel):
    """The router's and planner's settings: the generation the ConfigMap holds and the ones they
    run, as the planner reports them (it polls every router). A colocated pool runs no planner:
    there the operator asks each router replica (`GET /ready`) and `planner` stays unset."""

    desired_generation: int | None = Field(default=None, ge=0)
    """`metadata.generation` whose settings the ConfigMap holds."""
    router: LoadedConfig | None = None
    """What the router replicas run."""
    planner: LoadedConfig | None = None
    """What the active planner runs."""


class PrefillFit(ApiModel):
    """Fitted Eq. 1 coefficients (seconds, per token, per query-key pair, per restored token)."""

    c0: float
    """Fixed cost of an iteration (s)."""
    c1: float
    """Per uncached token (s)."""
    c2: float
    """Per query-key pair of attention (s)."""
    c3: float
    """Per token restored from host memory (s)."""


class DecodeFit(ApiModel):
    """Fitted Eq. 2 coefficients (seconds)."""

    d0: float
    """Fixed cost of an iteration (s)."""
    d1: float
    """Cost of reading the routed experts, times `phi(B)` (s)."""
    d2: float
    """Per running request (s)."""


class ModelFitStatus(ApiModel):
    """The planner's iteration-time models (fitted by NNLS during the warmup, then frozen)."""

    state: Literal["Learning", "Fitted"]
    """`Learning` during the warmup, `Fitted` once frozen."""
    records: int = Field(default=0, ge=0)
    """Iteration records used so far."""
    fitted_at: datetime | None = Field(default=None, strict=False)
    """When the models were frozen."""
    prefill: PrefillFit | None = None
    """Prefill iteration model (Eq. 1)."""
    decode: DecodeFit | None = None
    """Decode iteration model (Eq. 2)."""


class AgentServingPoolStatus(ApiModel):
    """Observed state of the pool."""

    observed_generation: int | None = Field(default=None, ge=0)
    """`metadata.generation` the operator last reconciled."""
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """`Ready`, `Progressing` and `Degraded`, each with a reason."""
    config_generation: int | None = Field(default=None, ge=0)
    """`metadata.generation` whose router and planner settings the pool's ConfigMap holds; the
    router and planner re-read it within seconds, without a restart."""
    config: ConfigStatus | None = None
    """The settings generation the ConfigMap holds and the ones the router and planner run."""
    split: SplitStatus | None = None
    """Current split: the roles the engines report serving."""
    desired_split: SplitStatus | None = None
    """The split the planner asks for (the pods' `agentpool.io/role` annotations)."""
    ready_nodes: int = Field(default=0, ge=0)
    """Engine nodes that are ready."""
    nodes: list[NodeStatus] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    """Every engine node with its desired and observed role."""
    switches: SwitchStatus | None = None
    """Phase switches."""
    model_fit: ModelFitStatus | None = None
    """Iteration-time models the planner uses."""

    @field_validator("conditions")
    @classmethod
    def _one_condition_per_type(cls, conditions: list[Condition]) -> list[Condition]:
        _reject_duplicates("condition type", [c.type for c in conditions])
        return conditions

    @field_validator("nodes")
    @classmethod
    def _one_entry_per_node(cls, nodes: list[NodeStatus]) -> list[NodeStatus]:
        _reject_duplicates("node name", [n.name for n in nodes])
        return nodes


def _reject_duplicates(what: str, keys: list[str]) -> None:
    """List-map semantics (`x-kubernetes-list-type: map`): one entry per key."""
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise ValueError(f"duplicate {what}: {', '.join(duplicates)}")
