"""`AgentServingPool`: the pool spec (the single source of the CRD schema) and the resource."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field

from agentpool.api.base import ApiModel, CrossFieldRule
from agentpool.api.control import (
    KvPoolSpec,
    ManagedRedisSpec,
    PlannerSpec,
    RedisSpec,
    RouterSpec,
    SloSpec,
)
from agentpool.api.engine import EngineSpec, ModelSpec
from agentpool.api.status import AgentServingPoolStatus

GROUP = "agentpool.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "AgentServingPool"
PLURAL = "agentservingpools"
SINGULAR = "agentservingpool"
SHORT_NAMES = ("asp",)

PoolMode = Literal["disaggregated", "colocated"]
POOL_MODES: tuple[str, ...] = get_args(PoolMode)


class InitialSplitSpec(ApiModel):
    """How many nodes start as prefill nodes; the rest start as decode nodes."""

    prefill: int = Field(ge=0)
    """Initial prefill nodes, from `planner.minNodes.prefill` to `nodes - planner.minNodes.decode`."""


def _disaggregated(m: AgentServingPoolSpec) -> bool:
    return m.mode == "disaggregated"


class AgentServingPoolSpec(ApiModel):
    """A pool of symmetric engines serving one model to agents, with its control plane."""

    model: ModelSpec
    """The model served."""
    engine: EngineSpec
    """The engine on every node."""
    nodes: int = Field(ge=1, le=4096)
    """Number of engine nodes (one engine pod each)."""
    mode: PoolMode = "disaggregated"
    """`disaggregated`: each node serves prefill or decode and the planner moves nodes between the
    phases; `colocated`: every node serves both, there is no split."""
    initial_split: InitialSplitSpec | None = None
    """Starting split of a disaggregated pool (required there, not allowed in a colocated pool)."""
    slo: SloSpec
    """Latency objectives."""
    planner: PlannerSpec = Field(default=PlannerSpec())
    """Online prefill/decode split adaptation."""
    router: RouterSpec = Field(default=RouterSpec())
    """Request routing policy."""
    kv_pool: KvPoolSpec = Field(default=KvPoolSpec())
    """Shared host-memory KV pool and eviction."""
    redis: RedisSpec = Field(default=RedisSpec(managed=ManagedRedisSpec()))
    """Redis of the KV directory; a managed one by default."""

    rules = (
        CrossFieldRule(
            cel="self.mode == 'colocated' || has(self.initialSplit)",
            message=("a disaggregated pool needs spec.initialSplit.prefill (nodes that start as prefill)"),
            holds=lambda m: not _disaggregated(m) or m.initial_split is not None,
            field_path=".initialSplit",
        ),
        CrossFieldRule(
            cel="self.mode == 'disaggregated' || !has(self.initialSplit)",
            message="a colocated pool has no prefill/decode split: remove spec.initialSplit",
            holds=lambda m: _disaggregated(m) or m.initial_split is None,
            field_path=".initialSplit",
        ),
        CrossFieldRule(
            cel="self.mode == 'disaggregated' || !self.planner.enabled",
            message="a colocated pool has no split to plan: set spec.planner.enabled to false",
            holds=lambda m: _disaggregated(m) or not m.planner.enabled,
            field_path=".planner.enabled",
        ),
        CrossFieldRule(
            cel=(
                "self.mode == 'colocated' || "
                "self.nodes >= self.planner.minNodes.prefill + self.planner.minNodes.decode"
            ),
            message=(
                "spec.nodes must be at least spec.planner.minNodes.prefill + spec.planner.minNodes.decode"
            ),
            holds=lambda m: (
                not _disaggregated(m) or m.nodes >= m.planner.min_nodes.prefill + m.planner.min_nodes.decode
            ),
            field_path=".nodes",
        ),
        CrossFieldRule(
            cel="!has(self.initialSplit) || self.initialSplit.prefill >= self.planner.minNodes.prefill",
            message="spec.initialSplit.prefill must be at least spec.planner.minNodes.prefill",
            holds=lambda m: m.initial_split is None or m.initial_split.prefill >= m.planner.min_nodes.prefill,
            field_path=".initialSplit.prefill",
        ),
        CrossFieldRule(
            cel=(
                "!has(self.initialSplit) || "
                "self.initialSplit.prefill <= self.nodes - self.planner.minNodes.decode"
            ),
            message="spec.initialSplit.prefill must be at most spec.nodes - spec.planner.minNodes.decode",
            holds=lambda m: (
                m.initial_split is None or m.initial_split.prefill <= m.nodes - m.planner.min_nodes.decode
            ),
            field_path=".initialSplit.prefill",
        ),
    )

    @property
    def initial_prefill(self) -> int:
        """Prefill nodes at start (0 in a colocated pool, where every node serves both)."""
        return self.initial_split.prefill if self.initial_split is not None else 0

    @property
    def initial_decode(self) -> int:
        """Decode nodes at start (0 in a colocated pool)."""
        return self.nodes - self.initial_prefill if self.initial_split is not None else 0


class AgentServingPool(ApiModel):
    """The custom resource: `apiVersion`, `kind`, `metadata`, `spec` and `status`."""

    api_version: Literal["agentpool.io/v1alpha1"]
    kind: Literal["AgentServingPool"]
    metadata: dict[str, Any] = Field(default={})
    spec: AgentServingPoolSpec
    status: AgentServingPoolStatus | None = None
