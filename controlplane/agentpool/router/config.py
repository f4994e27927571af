"""Router configuration (pydantic, at the edge) and its conversion to the pure policy context.

The operator renders the pool's router settings into a YAML or JSON file (a ConfigMap volume); the
router re-reads it when it changes (:class:`ConfigFile`), so policy, knobs, SLO, fetch model and the
node list change without a restart.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentpool.api.settings import RouterSettings
from agentpool.models import FetchModel, TtftSlo
from agentpool.router.policy import DEFAULT_TPOT_SLO_S, PolicyContext, PolicyError, Role, create_policy


class ConfigError(ValueError):
    """The router configuration is invalid."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class SloConfig(_Strict):
    ttft_base_s: float = Field(2.0, gt=0, alias="ttftBase")
    ttft_per_token_s: float = Field(1e-4, ge=0, alias="ttftPerToken")
    # the pool's TPOT objective (s per output token): smetric's SLO check on colocated nodes
    tpot_s: float = Field(DEFAULT_TPOT_SLO_S, gt=0, alias="tpot")


class FetchConfig(_Strict):
    base_s: float = Field(0.45e-3, ge=0, alias="base")
    per_token_s: float = Field(1e-6, ge=0, alias="perToken")
    min_tokens: int = Field(512, ge=0, alias="minTokens")


class NodeModelConfig(_Strict):
    """Eq. 1/2 coefficients of a node until the planner's online fit replaces them (seconds)."""

    c0: float = Field(0.01, ge=0)
    c1: float = Field(5e-5, ge=0)
    c2: float = Field(1e-10, ge=0)
    c3: float = Field(1e-7, ge=0)
    d0: float = Field(0.01, ge=0)
    d1: float = Field(0.005, ge=0)
    d2: float = Field(1e-4, ge=0)
    t_bar: float = Field(8192.0, gt=0, alias="tBar")


class NodeConfig(_Strict):
    id: str = Field(min_length=1, max_length=200)
    url: str = Field(pattern=r"^https?://")
    role: Role = Role.BOTH
    kv_capacity_tokens: int = Field(1_000_000, ge=0, alias="kvCapacityTokens")


class TimeoutConfig(_Strict):
    connect_s: float = Field(2.0, gt=0, alias="connect")
    first_event_s: float = Field(120.0, gt=0, alias="firstEvent")
    between_events_s: float = Field(30.0, gt=0, alias="betweenEvents")
    directory_s: float = Field(2.0, gt=0, alias="directory")
    # how long a prefilled request waits for a decode node with KV room before it fails (503) when no
    # decode node has decodes running that would free enough room (while one does, it keeps waiting)
    decode_wait_s: float = Field(30.0, gt=0, alias="decodeWait")
    # the most a prefilled request waits for decode KV room at all: keep it below the engines'
    # fetch.handoverTtl (120 s by default), after which the prefill node drops the request's KV
    decode_wait_max_s: float = Field(100.0, gt=0, alias="decodeWaitMax")
    # how long a client may take to send a request body; slower (or partial) bodies get 408, closed
    body_s: float = Field(30.0, gt=0, alias="body")


class LimitsConfig(_Strict):
    """Caps on what one request may ask; over a cap is the client's fault (400/413)."""

    max_json_depth: int = Field(64, ge=4, le=10_000, alias="maxJsonDepth")
    max_messages: int = Field(10_000, ge=1, alias="maxMessages")
    max_output_tokens: int = Field(1 << 20, ge=1, alias="maxOutputTokens")
    max_prompt_tokens: int = Field(1 << 21, ge=1, alias="maxPromptTokens")


class KubernetesDiscoveryConfig(_Strict):
    """Engines from the EndpointSlices of a Service (ready endpoints; the pod name is the node id)."""

    namespace: str = Field(min_length=1, max_length=253)
    service: str = Field(min_length=1, max_length=253)
    port: str | int = "http"  # the endpoint port's name or number
    scheme: Literal["http", "https"] = "http"
    interval_s: float = Field(5.0, gt=0, alias="interval")
    kubeconfig: str | None = None  # default: the pod's service account


class DiscoveryConfig(_Strict):
    """Engines beyond the configured ``nodes``: a report with a ``url`` registers its engine (the
    registry; reports are authenticated), which is removed after ``registryTtl`` without a report;
    and, when set, the EndpointSlices of a Kubernetes Service."""

    registry: bool = True
    registry_ttl_s: float = Field(10.0, gt=0, alias="registryTtl")
    kubernetes: KubernetesDiscoveryConfig | None = None


class RouterConfig(_Strict):
    # the AgentServingPool generation this config was rendered for (set by the operator); the
    # router passes it on in its work batches, so the pool's status can say which one it runs
    generation: int | None = Field(None, ge=0)
    model: str = "agentpool"
    tokenizer: str = "builtin"
    policy: str = "evolving"
    knobs: dict[str, float] = Field(default_factory=dict)
    slo: SloConfig = SloConfig()
    fetch: FetchConfig = FetchConfig()
    copy_price_s_per_token: float = Field(1e-7, ge=0, alias="copyPrice")
    page_size: int = Field(64, gt=0, alias="pageSize")
    max_report_age_s: float = Field(5.0, gt=0, alias="maxReportAge")
    max_queue_per_node: int = Field(64, gt=0, alias="maxQueuePerNode")
    max_retries: int = Field(2, ge=0, alias="maxRetries")
    max_requeues: int = Field(8, ge=0, alias="maxRequeues")
    max_body_bytes: int = Field(8 * 1024 * 1024, gt=0, alias="maxBodyBytes")
    default_output_tokens: int = Field(256, ge=0, alias="defaultOutputTokens")
    retry_after_s: int = Field(1, ge=1, alias="retryAfter")
    timeouts: TimeoutConfig = TimeoutConfig()
    limits: LimitsConfig = LimitsConfig()
    # the model's context (the pool's spec.model.contextLength): no prompt over it is taken, and
    # GET /v1/models says it (max_model_len); None: only limits.maxPromptTokens caps prompts
    context_length: int | None = Field(None, ge=1, alias="contextLength")
    node_model: NodeModelConfig = Field(default_factory=NodeModelConfig, alias="nodeModel")
    nodes: list[NodeConfig] = Field(default_factory=list)
    discovery: DiscoveryConfig = DiscoveryConfig()
    # a failing node gets nothing for 2 s, doubled at each failure in a row, at most this long
    max_down_s: float = Field(60.0, gt=0, alias="maxDown")

    @model_validator(mode="after")
    def _check(self) -> RouterConfig:
        ids = [n.id for n in self.nodes]
        if len(ids) != len(set(ids)):
            raise ValueError(f"duplicate node ids in {ids}")
        try:
            create_policy(self.policy, self.knobs)
        except PolicyError as e:
            raise ValueError(str(e)) from e
        return self

    @property
    def prompt_cap(self) -> int:
        """The most prompt tokens a request may have: ``limits.maxPromptTokens``, and at most the context."""
        cap = self.limits.max_prompt_tokens
        return cap if self.context_length is None else min(cap, self.context_length)

    def policy_context(self) -> PolicyContext:
        return PolicyContext(
            slo=TtftSlo(base=self.slo.ttft_base_s, per_token=self.slo.ttft_per_token_s),
            fetch=FetchModel(
                base_s=self.fetch.base_s, per_token_s=self.fetch.per_token_s, min_tokens=self.fetch.min_tokens
            ),
            kappa_s_per_token=self.copy_price_s_per_token,
            page_size=self.page_size,
            max_report_age_s=self.max_report_age_s,
            max_queue_per_node=self.max_queue_per_node,
            tpot_slo_s=self.slo.tpot_s,
        )

    @property
    def disaggregated(self) -> bool:
        return any(n.role is not Role.BOTH for n in self.nodes)


Format = Literal["yaml", "json"]


def parse_config(text: str, fmt: Format = "yaml") -> RouterConfig:
    try:
        raw = json.loads(text) if fmt == "json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"router config is not valid {fmt}: {e}") from e
    try:
        return RouterConfig.model_validate(raw or {})
    except ValidationError as e:
        raise ConfigError(f"invalid router config: {e}") from e


def config_from_settings(
    router: RouterSettings,
    slo: TtftSlo,
    *,
    tpot_s: float,
    model: str,
    nodes: Sequence[NodeConfig],
    tokenizer: str = "builtin",
    page_size: int = 64,
    generation: int | None = None,
    node_model: Mapping[str, float] | None = None,
    context_length: int | None = None,
) -> RouterConfig:
    """The router's config from the pool spec's plain settings (for the operator to render);
    ``node_model``: Eq. 1/2's coefficients to predict with until fits arrive (`c0`..`d2`; None:
    the generic defaults); ``context_length``: the model's context, the longest prompt the router
    takes (a longer one gets 400 ``context_length_exceeded``; None: the default cap)."""
    extra: dict[str, Any] = {} if node_model is None else {"nodeModel": dict(node_model)}
    if context_length is not None:
        extra["contextLength"] = context_length
    return RouterConfig.model_validate(
        {
            **extra,
            "generation": generation,
            "model": model,
            "tokenizer": tokenizer,
            "policy": router.policy,
            "knobs": dict(router.knobs),
            "slo": {"ttftBase": slo.base, "ttftPerToken": slo.per_token, "tpot": tpot_s},
            "fetch": {
                "base": router.fetch.base_s,
                "perToken": router.fetch.per_token_s,
                "minTokens": router.fetch.min_tokens,
            },
            "copyPrice": router.copy_price_s_per_token,
            "maxReportAge": router.state_max_age_s,
            "pageSize": page_size,
            "nodes": [n.model_dump(by_alias=True, mode="json") for n in nodes],
        }
    )


def render_config(config: RouterConfig) -> str:
    """JSON text of ``config`` as :func:`parse_config` reads it back."""
    return config.model_dump_json(by_alias=True)


class ConfigFile:
    """A config file re-read when its modification time or size changes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._stamp: tuple[int, int] | None = None

    def _current_stamp(self) -> tuple[int, int]:
        st = self.path.stat()
        return (st.st_mtime_ns, st.st_size)

    def load(self) -> RouterConfig:
        stamp = self._current_stamp()
        fmt: Format = "json" if self.path.suffix == ".json" else "yaml"
        config = parse_config(self.path.read_text(), fmt)
        self._stamp = stamp
        return config

    def changed(self) -> bool:
        try:
            return self._current_stamp() != self._stamp
        except FileNotFoundError:
            return False
