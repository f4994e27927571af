"""The systems the simulator compares: each one is a configuration of the same plugins.

A system picks a pool layout, a routing policy from :mod:`agentpool.router.policy`'s registry, a
split planner, how a node switches phase, how a node gets KV that a peer holds, and the host-memory
eviction order. Nothing else differs: the same node model, directory and event loop run them all.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field


class Pool(enum.StrEnum):
    DISAGGREGATED = "disaggregated"
    COLOCATED = "colocated"


class SwitchMode(enum.StrEnum):
    IN_PLACE = "in-place"  # drain, switch in place; KV stays readable (symmetric engines + pool)
    RELAUNCH = "relaunch"  # drain, node out of service for the relaunch time, its KV lost (Dynamo)
    STRANDED = "stranded"  # drain, switch in place, but its KV is unreachable afterwards (Arrow)
    FREE = "free"  # oracle: drain, switch at no cost, KV stays


class FetchMode(enum.StrEnum):
    ASYNC = "async"  # fetch from a peer's host memory while the request waits (agentpool)
    SYNC = "sync"  # load at prefill start; the batch waits (upstream HiCache + memory pool)
    NONE = "none"  # no peer pool: recompute what the node lacks
    FREE = "free"  # oracle: every peer prefix is available at no cost


class PlannerKind(enum.StrEnum):
    NONE = "none"
    EVOLVING = "evolving"
    DYNAMO = "dynamo"
    ARROW = "arrow"
    ORACLE = "oracle"


class Eviction(enum.StrEnum):
    BRANCH_COUNT = "branch-count"  # (R > 0, last access): Algorithm E.2 with branch ids
    LRU = "lru"


STATIC_REFERENCE = "static-reference"
# SGLang PD disaggregation (every baseline but Arrow runs on it, evolving-infra §6.1): the decode
# node reserves a request's KV when the gateway dispatches it, before its prefill is queued, and
# holds it while the request waits for prefill (App. D.1: 91% of 6P3D's decode KV on OSWorld)
SGLANG_BINDING = "dispatch"


def split_of(name: str) -> int | None:
    """The prefill nodes a ``static-reference@P`` run pins (None for any other name)."""
    base, at, p = name.partition("@")
    if not at:
        return None
    if base != STATIC_REFERENCE or not p.isdigit():
        raise ValueError(f"only {STATIC_REFERENCE}@P takes a split, got {name!r}")
    return int(p)


@dataclass(frozen=True, slots=True)
class SystemConfig:
    name: str
    description: str
    pool: Pool
    policy: str
    planner: PlannerKind
    switch: SwitchMode
    fetch: FetchMode
    eviction: Eviction
    policy_knobs: Mapping[str, float] = field(default_factory=dict)
    unlimited_cache: bool = False
    # the harness sends its session (branch) id to the router even without branch-count eviction
    session_header: bool = False
    # when a request's decode KV is reserved (``agentpool.sim.config.DECODE_BINDINGS``); None: the
    # comparison's ``SimConfig.decode_binding``. The SGLang PD baselines reserve at dispatch.
    decode_binding: str | None = None

    @property
    def branch_ids(self) -> bool:
        """Whether the harness tags requests with branch ids (needed for branch counts)."""
        return self.eviction is Eviction.BRANCH_COUNT

    @property
    def router_sees_branch(self) -> bool:
        """Whether the router's request view carries the branch id."""
        return self.branch_ids or self.session_header


def _d(name: str, description: str, **kw: object) -> SystemConfig:
    base: dict[str, object] = {
        "pool": Pool.DISAGGREGATED,
        "planner": PlannerKind.NONE,
        "switch": SwitchMode.IN_PLACE,
        "fetch": FetchMode.NONE,
        "eviction": Eviction.LRU,
    }
    base.update(kw)
    return SystemConfig(name=name, description=description, **base)  # type: ignore[arg-type]


def _colocated(policy: str, description: str, **kw: object) -> SystemConfig:
    return _d(policy, description, pool=Pool.COLOCATED, policy=policy, fetch=FetchMode.SYNC, **kw)


SYSTEMS: Mapping[str, SystemConfig] = {
    s.name: s
    for s in (
        _d(
            "agentpool",
            "evolving router, online planner, branch-count eviction, async fetch, in-place switches",
            policy="evolving",
            planner=PlannerKind.EVOLVING,
            fetch=FetchMode.ASYNC,
            eviction=Eviction.BRANCH_COUNT,
        ),
        _d(
            "agentpool-smetric",
            "agentpool with the smetric routing policy",
            policy="smetric",
            planner=PlannerKind.EVOLVING,
            fetch=FetchMode.ASYNC,
            eviction=Eviction.BRANCH_COUNT,
        ),
        _d(
            "agentpool-lru",
            "agentpool with LRU host eviction instead of branch counts (routing still sees branches)",
            policy="evolving",
            planner=PlannerKind.EVOLVING,
            fetch=FetchMode.ASYNC,
            session_header=True,
        ),
        _d(
            "static-cache-aware",
            "SGLang PD at a static split: cache-aware routing, LRU, no peer pool",
            policy="cache-aware",
            decode_binding=SGLANG_BINDING,
        ),
        _d(
            "dynamo-like",
            "SGLang gateway cache-aware routing (as the paper routes every baseline), Dynamo's load "
            "planner (queue/KV utilization), switches by relaunch, LRU, no peer pool",
            policy="cache-aware",
            planner=PlannerKind.DYNAMO,
            switch=SwitchMode.RELAUNCH,
            decode_binding=SGLANG_BINDING,
        ),
        _d(
            "dynamo-like-late-reserve",
            "dynamo-like, but decode KV reserved when the prefill starts (as agentpool does), not at "
            "dispatch: shows what SGLang's early reservations do to Dynamo's signals",
            policy="cache-aware",
            planner=PlannerKind.DYNAMO,
            switch=SwitchMode.RELAUNCH,
            decode_binding="prefill-start",
        ),
        _d(
            "dynamo-like+pool",
            "dynamo-like plus a shared host-memory pool read synchronously at prefill start",
            policy="cache-aware",
            planner=PlannerKind.DYNAMO,
            switch=SwitchMode.RELAUNCH,
            fetch=FetchMode.SYNC,
            decode_binding=SGLANG_BINDING,
        ),
        _d(
            "arrow-like",
            "TTFT planner predicting from full input length, in-place switches that strand KV, "
            "KV-agnostic (least-loaded) routing, LRU",
            policy="least-loaded",
            planner=PlannerKind.ARROW,
            switch=SwitchMode.STRANDED,
        ),
        _d(
            "oracle-reference",
            "reference, not a bound: Eq. 5's best split for each past window, unlimited shared cache, "
            "free fetches and switches",
            policy="evolving",
            planner=PlannerKind.ORACLE,
            switch=SwitchMode.FREE,
            fetch=FetchMode.FREE,
            unlimited_cache=True,
        ),
        _d(
            STATIC_REFERENCE,
            "hindsight reference: the best static split over the whole run (every split swept), "
            "unlimited shared cache, free fetches, no switches",
            policy="evolving",
            fetch=FetchMode.FREE,
            unlimited_cache=True,
        ),
        _colocated("smetric", "colocated, SMetric session-centric routing, global tier read at prefill"),
        _colocated("lmetric", "colocated, LMetric (queued prefill + miss) x load"),
        _colocated("linear", "colocated, Bailian-style linear combination of load and miss"),
        _colocated("least-loaded", "colocated, join the shortest queue"),
        _colocated(
            "session-id",
            "colocated, sticky by the true session (branch) id, llm-d-style session affinity",
            session_header=True,
        ),
    )
}

DISAGGREGATED_DEFAULT = ("agentpool", "static-cache-aware", "dynamo-like", "arrow-like", "oracle-reference")
COLOCATED_DEFAULT = ("smetric", "lmetric", "linear", "least-loaded", "session-id")


def system(name: str) -> SystemConfig:
    """The system ``name``; ``static-reference@P`` is the static reference at ``P`` prefill nodes."""
    name = name.partition("@")[0]
    try:
        return SYSTEMS[name]
    except KeyError:
        raise ValueError(f"unknown system {name!r}; known: {sorted(SYSTEMS)}") from None
