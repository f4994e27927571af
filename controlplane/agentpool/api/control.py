"""The control-plane sections of the spec: SLO, planner, router, KV pool and Redis.

Each section converts to the plain values its consumer takes (:mod:`agentpool.api.settings`,
:class:`agentpool.models.TtftSlo`), with seconds as floats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from pydantic import Field
from pydantic.alias_generators import to_camel

from agentpool.api.auth import SECRET_KEY_PATTERN, SECRET_NAME_PATTERN
from agentpool.api.base import ApiModel, CrossFieldRule
from agentpool.api.settings import FetchSettings, PlannerSettings, RouterSettings
from agentpool.api.values import Duration, PositiveDuration, duration_seconds
from agentpool.models import TtftSlo
from agentpool.models.refit import RefitPolicy

PolicyName = Literal[
    "evolving",
    "smetric",
    "round-robin",
    "least-loaded",
    "cache-aware",
    "dynamo",
    "lmetric",
    "linear",
    "session-id",
]
POLICY_NAMES: tuple[str, ...] = get_args(PolicyName)
"""Router policy names; the router's policy registry must hold exactly these."""

EvictionPolicy = Literal["branch-count", "lru"]
TransferBackend = Literal["nixl", "none"]


class TtftSpec(ApiModel):
    """TTFT deadline `base + perKiloToken * L / 1000` for a prompt of `L` tokens."""

    base: PositiveDuration
    """Deadline of an empty prompt, e.g. `2s`."""
    per_kilo_token: Duration = "0s"
    """Deadline added per 1000 prompt tokens, e.g. `100ms`."""


class SloSpec(ApiModel):
    """Latency objectives the router and planner aim for."""

    ttft: TtftSpec
    """Time to first token."""
    tpot: PositiveDuration
    """Time per output token, e.g. `50ms`."""

    def ttft_slo(self) -> TtftSlo:
        return TtftSlo(
            base=duration_seconds(self.ttft.base),
            per_token=duration_seconds(self.ttft.per_kilo_token, per=1000),
        )

    @property
    def tpot_s(self) -> float:
        return duration_seconds(self.tpot)


class MinNodesSpec(ApiModel):
    """The fewest nodes the planner leaves in each phase."""

    prefill: int = Field(default=1, ge=1)
    """Fewest prefill nodes."""
    decode: int = Field(default=1, ge=1)
    """Fewest decode nodes."""


_REFIT = RefitPolicy()  # the defaults


class RefitSpec(ApiModel):
    """When a window's work refits a node's iteration models: its records leave the range the
    models were fitted on (by `margin`), enough of them (`minRecords` and `minShare`), and the
    models mispredict them (`maxError`)."""

    enabled: bool = True
    """Refit at all; false keeps the warmup's fit frozen, as the paper does."""
    margin: float = Field(default=_REFIT.margin, ge=1, le=100)
    """A window record is out of range when a regressor lies above `margin` times its largest
    fitted value, or below its smallest positive fitted value divided by `margin`."""
    min_records: int = Field(default=_REFIT.min_records, ge=1, le=100_000)
    """Out-of-range records of a node and phase a window needs to refit ..."""
    min_share: float = Field(default=_REFIT.min_share, ge=0, le=1)
    """... and their least share of the window's records of that phase."""
    max_error: float = Field(default=_REFIT.max_error, ge=0, le=10)
    """Refit only when the current model's mean relative error on those records exceeds this."""
    max_records: int = Field(default=_REFIT.max_records, ge=2, le=1_000_000)
    """Records a refit fits on at most: fitted and window, half each."""

    rules = (
        CrossFieldRule(
            # defaults spelt out: kube-apiserver checks the section's default ({}) against it as is
            cel=(
                f"(has(self.maxRecords) ? self.maxRecords : {_REFIT.max_records})"
                f" >= 2 * (has(self.minRecords) ? self.minRecords : {_REFIT.min_records})"
            ),
            message="refit.maxRecords must be at least 2 x refit.minRecords",
            holds=lambda m: m.max_records >= 2 * m.min_records,
            field_path=".maxRecords",
        ),
    )

    def policy(self) -> RefitPolicy:
        return RefitPolicy(
            margin=self.margin,
            min_records=self.min_records,
            min_share=self.min_share,
            max_error=self.max_error,
            max_records=self.max_records,
        )


class PlannerSpec(ApiModel):
    """The planner sizes the prefill/decode split from online-fitted iteration models (§5.2)."""

    enabled: bool = True
    """Whether the split adapts at run time; when false the initial split stays."""
    window: PositiveDuration = "10m"
    """`T_win`: the planner decides at the end of each window."""
    slices: int = Field(default=10, ge=2, le=1000)
    """`m`: slices per window; a switch needs a gain that persists across them."""
    warmup: Duration = "30m"
    """`T_learn`: colocated warmup during which the iteration models are fitted."""
    cooldown: Duration = "2m"
    """No switch within this long after the previous switch."""
    min_nodes: MinNodesSpec = Field(default=MinNodesSpec())
    """Minimum number of nodes per phase."""
    refit: RefitSpec = Field(default=RefitSpec())
    """Refit a node's iteration models when a window's work leaves the range they were fitted on
    and they mispredict it (`enabled: false` keeps the warmup's fit frozen, as the paper does)."""
    min_relative_gain: float = Field(default=0.03, ge=0, lt=1)
    """A switch must also gain at least this fraction of the current split's predicted throughput,
    and a candidate that moves more nodes must beat one that moves fewer by as much; 0 is the
    paper's test alone (mean gain above twice its standard error)."""

    def settings(self) -> PlannerSettings:
        return PlannerSettings(
            enabled=self.enabled,
            window_s=duration_seconds(self.window),
            slices=self.slices,
            warmup_s=duration_seconds(self.warmup),
            cooldown_s=duration_seconds(self.cooldown),
            min_prefill=self.min_nodes.prefill,
            min_decode=self.min_nodes.decode,
            refit=self.refit.enabled,
            refit_policy=self.refit.policy(),
            min_relative_gain=self.min_relative_gain,
        )


class SmetricKnobs(ApiModel):
    """Knobs of the `smetric` policy (session-centric routing)."""

    slack: float = Field(default=1.0, gt=0)
    """A node meets the TTFT SLO if its predicted prefill time is at most `slack` times the deadline."""
    hit_ratio: float = Field(default=0.8, ge=0, le=1)
    """A session counts as evicted when its best local hit is below this fraction of its expected hit."""


class CacheAwareKnobs(ApiModel):
    """Knobs of the `cache-aware` policy (SGLang model gateway style; its defaults)."""

    cache_threshold: float = Field(default=0.3, ge=0, le=1)
    """Route to the longest match only if it covers at least this fraction of the prompt."""
    balance_abs: float = Field(default=64.0, ge=0)
    """Balance by load instead when max - min load exceeds this many requests ..."""
    balance_rel: float = Field(default=1.5, ge=1)
    """... and max load exceeds this multiple of the min load."""


class DynamoKnobs(ApiModel):
    """Knobs of the `dynamo` policy (Dynamo KV router cost)."""

    host_credit: float = Field(default=0.75, ge=0, le=1)
    """Credit for a block cached in host memory relative to one in GPU memory."""
    overlap_weight: float = Field(default=1.0, ge=0)
    """Weight of the cached-prefix credit against the prefill blocks."""


class LinearKnobs(ApiModel):
    """Knobs of the `linear` policy: `(1 - lambda) * load + lambda * miss`."""

    lam: float = Field(default=0.8, ge=0, le=1, alias="lambda")
    """`lambda`: weight of the cache miss against the load."""


class FetchSpec(ApiModel):
    """`tau(x)`: time to fetch `x` prefix tokens from a peer's host memory."""

    base: Duration = "0.45ms"
    """Fixed time of one fetch."""
    per_kilo_token: Duration = "1ms"
    """Time per 1000 fetched tokens."""
    min_tokens: int = Field(default=512, ge=0)
    """Shorter missing prefixes are recomputed instead of fetched."""


class CopyPriceSpec(ApiModel):
    """`kappa`: predicted TTFT charged for the duplicate KV copy a fetch creates."""

    per_kilo_token: Duration = "0.1ms"
    """Charge per 1000 fetched tokens."""


@dataclass(frozen=True, slots=True)
class _KnobSection:
    """A policy whose knobs have their own section in `spec.router` (e.g. `cacheAware`)."""

    policy: str
    attr: str
    knobs: type[ApiModel]

    @property
    def wire(self) -> str:
        return to_camel(self.attr)

    def rule(self) -> CrossFieldRule:
        return CrossFieldRule(
            cel=f"!has(self.{self.wire}) || self.policy == '{self.policy}'",
            message=(
                f"spec.router.{self.wire} configures the {self.policy} policy, "
                f"but spec.router.policy is not {self.policy}"
            ),
            holds=lambda m: getattr(m, self.attr) is None or m.policy == self.policy,
            field_path=f".{self.wire}",
        )


_KNOB_SECTIONS = (
    _KnobSection("smetric", "smetric", SmetricKnobs),
    _KnobSection("cache-aware", "cache_aware", CacheAwareKnobs),
    _KnobSection("dynamo", "dynamo", DynamoKnobs),
    _KnobSection("linear", "linear", LinearKnobs),
)


class RouterSpec(ApiModel):
    """How the router picks a prefill node for each request."""

    policy: PolicyName = "evolving"
    """`evolving` (shortest predicted TTFT), `smetric` (session-centric) or a baseline:
    `round-robin`, `least-loaded`, `cache-aware`, `dynamo`, `lmetric`, `linear`."""
    smetric: SmetricKnobs | None = None
    """Knobs of `smetric`; only with that policy."""
    cache_aware: CacheAwareKnobs | None = None
    """Knobs of `cache-aware`; only with that policy."""
    dynamo: DynamoKnobs | None = None
    """Knobs of `dynamo`; only with that policy."""
    linear: LinearKnobs | None = None
    """Knobs of `linear`; only with that policy."""
    fetch: FetchSpec = Field(default=FetchSpec())
    """Fetch-time model used in the TTFT prediction."""
    copy_price: CopyPriceSpec = Field(default=CopyPriceSpec())
    """Price of duplicating KV by a fetch."""
    state_max_age: PositiveDuration = "5s"
    """A node's reported state older than this is not used."""

    rules = tuple(section.rule() for section in _KNOB_SECTIONS)

    def knobs(self) -> dict[str, float]:
        """Knobs of the selected policy with defaults filled in, named as the router's policy knob
        dataclasses name them (`agentpool.router.policy.create_policy(policy, knobs)`)."""
        for section in _KNOB_SECTIONS:
            if section.policy == self.policy:
                given = getattr(self, section.attr)
                chosen = given if given is not None else section.knobs()
                return {name: float(value) for name, value in chosen.model_dump().items()}
        return {}

    def settings(self) -> RouterSettings:
        return RouterSettings(
            policy=self.policy,
            knobs=self.knobs(),
            fetch=FetchSettings(
                base_s=duration_seconds(self.fetch.base),
                per_token_s=duration_seconds(self.fetch.per_kilo_token, per=1000),
                min_tokens=self.fetch.min_tokens,
            ),
            copy_price_s_per_token=duration_seconds(self.copy_price.per_kilo_token, per=1000),
            state_max_age_s=duration_seconds(self.state_max_age),
        )


class KvPoolSpec(ApiModel):
    """The shared host-memory KV pool and the directory that indexes it."""

    page_size: int = Field(default=64, ge=1, le=4096)
    """Tokens per KV block; block hashes chain over pages of this size."""
    eviction_policy: EvictionPolicy = "branch-count"
    """`branch-count`: evict blocks no active branch references first, LRU within each group
    (Algorithm E.2); `lru`: plain least recently used."""
    transfer_backend: TransferBackend = "nixl"
    """`nixl`: peers read each other's host KV directly; `none`: no fetches between nodes."""


class ManagedRedisSpec(ApiModel):
    """A Redis the operator runs for the pool (one replica, no persistence)."""

    image: str = Field(default="redis:7.4-alpine", min_length=1, max_length=512)
    """Container image of the managed Redis."""


class ExistingRedisSpec(ApiModel):
    """An existing Redis, named through a Secret so that neither its address nor its password
    appears in the pool."""

    secret_name: str = Field(min_length=1, max_length=253, pattern=SECRET_NAME_PATTERN)
    """Secret in the pool's namespace holding the Redis URL and, optionally, its password."""
    url_key: str = Field(default="url", min_length=1, max_length=253, pattern=SECRET_KEY_PATTERN)
    """Key of the URL, `redis://host:6379/0` or `rediss://` for TLS, without a password."""
    password_key: str | None = Field(default=None, min_length=1, max_length=253, pattern=SECRET_KEY_PATTERN)
    """Key of the password; leave out for a Redis without one."""


class RedisSpec(ApiModel):
    """Where the directory keeps branch state: a managed Redis or an existing one (exactly one)."""

    managed: ManagedRedisSpec | None = None
    """Let the operator run a Redis for this pool (password generated into `<pool>-redis`)."""
    existing: ExistingRedisSpec | None = None
    """Use an existing Redis, named through a Secret."""

    rules = (
        CrossFieldRule(
            cel="has(self.managed) != has(self.existing)",
            message="set exactly one of spec.redis.managed and spec.redis.existing",
            holds=lambda m: (m.managed is None) != (m.existing is None),
        ),
    )
