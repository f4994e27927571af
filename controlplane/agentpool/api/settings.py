"""Plain values the planner and router build from the spec (seconds as floats, tokens as ints).

The pydantic sections in :mod:`agentpool.api.control` convert to these with `settings()`; the
services and the simulator take these dataclasses, never the wire models.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from agentpool.models.refit import RefitPolicy


@dataclass(frozen=True, slots=True)
class PlannerSettings:
    """The planner's outer loop (evolving-infra §5.2, Algorithm E.3)."""

    enabled: bool
    window_s: float
    """`T_win`: length of a planning window."""
    slices: int
    """`m`: slices per window over which gains are measured."""
    warmup_s: float
    """`T_learn`: colocated warmup during which iteration models are fitted."""
    cooldown_s: float
    """No switch within this long after the previous one."""
    min_prefill: int
    min_decode: int
    refit: bool = True
    """Refit the iteration models when a window's work leaves their fitted range ..."""
    refit_policy: RefitPolicy = field(default_factory=RefitPolicy)
    """... by how much, on how many records, and how wrong they must be."""
    min_relative_gain: float = 0.03
    """A switch must gain at least this fraction of the current split's predicted throughput."""

    @property
    def slice_s(self) -> float:
        """Length of one slice, `T_win / m`."""
        return self.window_s / self.slices


@dataclass(frozen=True, slots=True)
class FetchSettings:
    """`tau(x) = base_s + per_token_s * x` for `x >= min_tokens`, else no fetch."""

    base_s: float
    per_token_s: float
    min_tokens: int


@dataclass(frozen=True, slots=True)
class RouterSettings:
    """The router's policy and the constants of its TTFT prediction (Eq. 7)."""

    policy: str
    """One of :data:`agentpool.api.POLICY_NAMES`."""
    knobs: Mapping[str, float]
    """Keyword parameters of the selected policy (snake_case names, defaults filled in)."""
    fetch: FetchSettings
    copy_price_s_per_token: float
    """`kappa`: seconds of predicted TTFT charged per fetched (duplicated) token."""
    state_max_age_s: float
    """The router ignores a node's reported state older than this."""
