"""The routing-policy contract: what a policy sees, what it returns, and the shared filters.

Pure and clock-free: the live router builds these views from HTTP requests, the KV directory and
engine reports; the simulator builds them from its virtual state. Both drive the same policies.

Flow (after the llm-d scheduler's filter -> scorer -> picker chain)::

    candidates = prefill_candidates(nodes, ctx)          # role, accepting, not draining, queue room
    if not candidates: back-pressure (HTTP 429) or no capacity (503)
    decision = policy.choose(request, candidates, ctx)  # scores the candidates, picks one
    ... when the prefill starts (disaggregated pools):
    binding = bind_decode(request, nodes, ctx)           # decode.py

Node state freshness: a node's reported state (running batch, reported queue) counts only while
the report is at most ``ctx.max_report_age_s`` old (5 s in the paper); the requests the router
sent after that report (``NodeState.unreported``) always count. :func:`effective_queue` and
:func:`effective_remaining_s` apply this rule; every policy uses them.

Knobs: each policy module declares its own knobs with defaults; :mod:`.registry` validates the
knob names and values and binds them when it creates the policy. Shared settings (SLO, fetch
model, copy price, page size, report age, queue limit) are in :class:`PolicyContext`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from agentpool.kv import Role as Role  # the one role type, re-exported with the policy contract
from agentpool.kv.hashing import DEFAULT_PAGE_SIZE
from agentpool.models import (
    DEFAULT_COPY_PRICE_S_PER_TOKEN,
    DEFAULT_FETCH_MODEL,
    FetchModel,
    LinearAttentionCost,
    NodeModel,
    TtftSlo,
    Work,
    attention_pairs,
)


class PolicyError(ValueError):
    """Bad input to a policy: unknown policy or knob, invalid view, no candidate."""


class NoCandidateError(PolicyError):
    """``choose`` was called without a candidate node; the caller must apply back-pressure first."""


@dataclass(frozen=True, slots=True)
class CachedPrefix:
    """The longest prefix of a request that one node holds, in tokens, by tier.

    ``gpu``: longest prefix whose blocks are all in the node's GPU memory.
    ``total``: longest prefix whose blocks are each in GPU or host memory of the node (>= ``gpu``).
    """

    gpu: int = 0
    total: int = 0

    def __post_init__(self) -> None:
        if self.gpu < 0 or self.total < self.gpu:
            raise PolicyError(f"need 0 <= gpu <= total, got {self}")

    @property
    def host_only(self) -> int:
        """Tokens of the prefix beyond the GPU part, which the node restores from host memory."""
        return self.total - self.gpu


NO_PREFIX = CachedPrefix()


@dataclass(slots=True)
class RequestView:
    """What a policy knows about one request. A value: policies and routers never modify one. Not
    frozen, as :class:`NodeState`: the router builds one for every request, and a frozen dataclass
    costs several times as much to build (it holds a mapping, so it was never hashable either).

    prompt_tokens: input tokens ``L``.
    turn: 1 + the number of assistant messages in the prompt (1 for a new session).
    new_turn_tokens: tokens appended since the previous turn (the newest user/tool messages).
    branch_id: the agent branch from ``x-agentpool-branch``, or ``None`` (session inferred).
    local_prefix: per node id, the prefix of the request the node holds (nodes absent hold none).
    cluster_prefix: the longest prefix of the request cached on any node, in tokens.
    expected_output_tokens: ``t_out`` estimate (``max_tokens`` or the pool default).
    """

    request_id: str
    prompt_tokens: int
    turn: int = 1
    new_turn_tokens: int = 0
    branch_id: str | None = None
    local_prefix: Mapping[str, CachedPrefix] = field(default_factory=dict)
    cluster_prefix: int = 0
    expected_output_tokens: int = 0

    def __post_init__(self) -> None:
        if self.prompt_tokens < 0 or self.expected_output_tokens < 0 or self.new_turn_tokens < 0:
            raise PolicyError(f"token counts must be non-negative: {self.request_id}")
        if self.turn < 1:
            raise PolicyError(f"turn must be >= 1, got {self.turn}")
        if self.cluster_prefix > self.prompt_tokens:
            raise PolicyError("cluster prefix longer than the prompt")

    def prefix_on(self, node_id: str) -> CachedPrefix:
        return self.local_prefix.get(node_id, NO_PREFIX)

    @property
    def expected_hit(self) -> int:
        """SMetric's ``est_hit``: the prompt minus its newly appended turn."""
        return max(0, self.prompt_tokens - self.new_turn_tokens)


@dataclass(frozen=True, slots=True)
class QueuedPrefill:
    """Aggregate of queued prefill work: enough for Eq. 3 sums and every baseline's load.

    Eq. 3 is linear in ``t_uc``, ``A`` and ``t_c``, so the sum of the service times of a queue is
    Eq. 3 evaluated on these sums (with the fixed cost split by ``sum t_uc / t_bar``).
    """

    requests: int = 0
    t_uc: float = 0.0
    t_c: float = 0.0
    pairs: float = 0.0

    @staticmethod
    def of(works: Sequence[Work]) -> QueuedPrefill:
        q = EMPTY_QUEUE
        for w in works:
            q = q.add(w)
        return q

    def add(self, w: Work) -> QueuedPrefill:
        return QueuedPrefill(
            self.requests + 1, self.t_uc + w.t_uc, self.t_c + w.t_c, self.pairs + w.attention_pairs
        )

    def with_request(self, t_uc: float, t_c: float, sign: int = 1) -> QueuedPrefill:
        """The queue with one request of ``t_uc`` uncached and ``t_c`` cached tokens added (``sign``
        +1) or taken out (-1); a queue left without requests is :data:`EMPTY_QUEUE` (no residue)."""
        requests = self.requests + sign
        if requests <= 0:
            return EMPTY_QUEUE
        return QueuedPrefill(
            requests,
            max(0.0, self.t_uc + sign * t_uc),
            max(0.0, self.t_c + sign * t_c),
            max(0.0, self.pairs + sign * attention_pairs(t_uc, t_c)),
        )

    def __add__(self, other: QueuedPrefill) -> QueuedPrefill:
        return QueuedPrefill(
            self.requests + other.requests,
            self.t_uc + other.t_uc,
            self.t_c + other.t_c,
            self.pairs + other.pairs,
        )

    def service_time(self, model: NodeModel) -> float:
        """Sum of Eq. 3 over the queued requests on a node with ``model``."""
        return eq3_of_sums(model, self.t_uc, self.t_c, self.pairs)

    def linear_attention_cost(self, cost: LinearAttentionCost) -> float:
        """Sum of SMetric's ``c_linear*n + c_attn*n*(L - n/2)``; ``n(L - n/2) = A - n/2``."""
        return cost.c_linear * self.t_uc + cost.c_attn * (self.pairs - self.t_uc / 2.0)


EMPTY_QUEUE = QueuedPrefill()


def eq3_of_sums(model: NodeModel, t_uc: float, t_c: float, pairs: float) -> float:
    """Eq. 3 summed over requests, from their summed ``t_uc``, ``t_c`` and ``A`` (linear in each).

    For one request, pass its own ``t_uc``, ``t_c`` and ``attention_pairs(t_uc, t_c)``; the result
    equals ``model.prefill_request_time(Work(t_uc, t_c))`` (a unit test checks it).
    """
    p = model.prefill
    return p.c0 * t_uc / model.t_bar + p.c1 * t_uc + p.c2 * pairs + p.c3 * model.f_restore * t_c


@dataclass(slots=True)
class NodeState:
    """What a policy knows about one engine node. A value: policies and routers never modify one. Not
    frozen: the router builds one per serving node for every request, and building a frozen dataclass
    costs about four times as much (3.7 against 0.8 us with its 12 fields).

    remaining_batch_s: remaining time of the running prefill batch (from the last report).
    queue: prefill work queued on the node at the last report.
    unreported: prefill work the router sent after the last report (always counted).
    running_decode: requests decoding on the node.
    kv_room_tokens / kv_used_tokens: free and used KV slots of the node's GPU memory.
    report_age_s: seconds since the last engine report, ``None`` before the first one.
    decode_waiting_tokens: KV tokens (prompt + output) of requests a colocated node has prefilled
    and that wait there for decode room, not counted in ``kv_used_tokens`` (the simulator's
    colocated nodes; live, the engines' reports: ``LoadReport.decode_waiting_tokens``).
    """

    node_id: str
    role: Role
    model: NodeModel
    remaining_batch_s: float = 0.0
    queue: QueuedPrefill = EMPTY_QUEUE
    unreported: QueuedPrefill = EMPTY_QUEUE
    running_decode: int = 0
    kv_room_tokens: int = 0
    kv_used_tokens: int = 0
    accepting: bool = True
    draining: bool = False
    report_age_s: float | None = None
    decode_waiting_tokens: int = 0

    def __post_init__(self) -> None:
        if self.remaining_batch_s < 0 or self.running_decode < 0:
            raise PolicyError(f"node {self.node_id}: negative load")
        if self.kv_room_tokens < 0 or self.kv_used_tokens < 0 or self.decode_waiting_tokens < 0:
            raise PolicyError(f"node {self.node_id}: negative KV counts")


DEFAULT_TTFT_SLO = TtftSlo(base=2.0, per_token=1e-4)
"""Default TTFT deadline ``2 s + 0.1 ms per prompt token`` until the pool configures one."""
DEFAULT_TPOT_SLO_S = 0.1
"""Default TPOT limit, seconds per output token (SMetric's measure in bench_sim smetric)."""


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """Pool-wide settings every policy may read; the router rebuilds it when the pool config changes."""

    slo: TtftSlo = DEFAULT_TTFT_SLO
    tpot_slo_s: float = DEFAULT_TPOT_SLO_S
    fetch: FetchModel = DEFAULT_FETCH_MODEL
    kappa_s_per_token: float = DEFAULT_COPY_PRICE_S_PER_TOKEN
    page_size: int = DEFAULT_PAGE_SIZE
    max_report_age_s: float = 5.0
    max_queue_per_node: int = 64

    def __post_init__(self) -> None:
        if self.page_size <= 0 or self.max_queue_per_node <= 0 or self.max_report_age_s <= 0:
            raise PolicyError(f"invalid policy context: {self}")
        if self.kappa_s_per_token < 0:
            raise PolicyError("copy price must be non-negative")
        if not self.tpot_slo_s > 0:
            raise PolicyError(f"TPOT SLO must be positive, got {self.tpot_slo_s}")


@dataclass(slots=True)
class RouteDecision:
    """A policy's choice of prefill (or colocated) node. A value (not frozen, as :class:`RequestView`:
    one is built for every request).

    cached_tokens: ``t_c`` on the chosen node (local prefix, plus the fetched tokens).
    fetch_tokens: ``x``, the prefix tokens the node fetches from another node (0: no fetch).
    scores: per candidate node, the policy's score (lower is better unless the reason says so).
    """

    node_id: str
    policy: str
    reason: str
    cached_tokens: int = 0
    fetch_tokens: int = 0
    scores: Mapping[str, float] = field(default_factory=dict)


class Policy(Protocol):
    """A routing policy: pure, may keep bounded internal state (e.g. a round-robin cursor)."""

    @property
    def name(self) -> str: ...

    def choose(
        self, request: RequestView, candidates: Sequence[NodeState], ctx: PolicyContext
    ) -> RouteDecision:
        """Pick one of ``candidates`` (never empty) for ``request``."""
        ...


# ---- shared helpers -------------------------------------------------------------------------


def is_fresh(node: NodeState, ctx: PolicyContext) -> bool:
    return node.report_age_s is not None and node.report_age_s <= ctx.max_report_age_s


def effective_queue(node: NodeState, ctx: PolicyContext) -> QueuedPrefill:
    """The queue a policy counts: reported (if fresh) plus sent-but-unreported."""
    return node.queue + node.unreported if is_fresh(node, ctx) else node.unreported


def effective_remaining_s(node: NodeState, ctx: PolicyContext) -> float:
    return node.remaining_batch_s if is_fresh(node, ctx) else 0.0


def queue_depth(node: NodeState, ctx: PolicyContext) -> int:
    if is_fresh(node, ctx):
        return node.queue.requests + node.unreported.requests
    return node.unreported.requests


def effective_queued_tokens(node: NodeState, ctx: PolicyContext) -> float:
    """Uncached tokens in the effective queue (``effective_queue(...).t_uc`` without allocating)."""
    if is_fresh(node, ctx):
        return node.queue.t_uc + node.unreported.t_uc
    return node.unreported.t_uc


def effective_service_s(node: NodeState, ctx: PolicyContext) -> float:
    """Remaining batch time plus Eq. 3 over the effective queue: the wait before a new request starts.

    Evaluated for every candidate of every request: :func:`is_fresh` and ``service_time`` are
    written out (same operations, one call less per term).
    """
    m = node.model
    u = node.unreported
    # Eq. 3 of nothing is 0.0 (coefficients are finite): skipped for the shared empty queue
    unreported = 0.0 if u is EMPTY_QUEUE else eq3_of_sums(m, u.t_uc, u.t_c, u.pairs)
    age = node.report_age_s
    if age is not None and age <= ctx.max_report_age_s:
        q = node.queue
        return node.remaining_batch_s + eq3_of_sums(m, q.t_uc, q.t_c, q.pairs) + unreported
    return unreported


def serves_prefill(node: NodeState) -> bool:
    return node.role in (Role.PREFILL, Role.BOTH)


def prefill_candidates(nodes: Sequence[NodeState], ctx: PolicyContext) -> list[NodeState]:
    """Nodes that may take a new prefill now: right role, accepting, not draining, queue not full."""
    limit = ctx.max_queue_per_node
    age = ctx.max_report_age_s
    out = []
    for n in nodes:
        if n.role is Role.DECODE or not n.accepting or n.draining:
            continue
        fresh = n.report_age_s is not None and n.report_age_s <= age
        depth = n.unreported.requests + (n.queue.requests if fresh else 0)
        if depth < limit:
            out.append(n)
    return out


def require_candidates(candidates: Sequence[NodeState]) -> None:
    if not candidates:
        raise NoCandidateError("no candidate node: apply back-pressure before calling a policy")


def local_work(request: RequestView, node: NodeState) -> Work:
    """The request's prefill work on ``node`` using only the node's own cached prefix."""
    cached = request.prefix_on(node.node_id).total
    return Work(
        t_uc=float(request.prompt_tokens - cached),
        t_c=float(cached),
        t_out=float(request.expected_output_tokens),
    )


def node_load_requests(node: NodeState, ctx: PolicyContext) -> int:
    """Requests on the node: queued prefills, plus running decodes when it serves both phases."""
    decode = node.running_decode if node.role is Role.BOTH else 0
    return queue_depth(node, ctx) + decode


def linear_attention_cost_of(model: NodeModel) -> LinearAttentionCost:
    """SMetric's cost from a node's Eq. 3 coefficients: ``c_linear = c1 + c0/t_bar``, ``c_attn = c2``."""
    return LinearAttentionCost(
        c_linear=model.prefill.c1 + model.prefill.c0 / model.t_bar, c_attn=model.prefill.c2
    )


def pick_min(scores: Mapping[str, float], tiebreak: Mapping[str, float] | None = None) -> str:
    """The node id with the lowest score; ties to the lowest ``tiebreak``, then the smallest id."""
    tb = tiebreak or {}
    return min(scores, key=lambda nid: (scores[nid], tb.get(nid, 0.0), nid))


__all__ = [
    "DEFAULT_TPOT_SLO_S",
    "DEFAULT_TTFT_SLO",
    "EMPTY_QUEUE",
    "NO_PREFIX",
    "CachedPrefix",
    "NoCandidateError",
    "NodeState",
    "Policy",
    "PolicyContext",
    "PolicyError",
    "QueuedPrefill",
    "RequestView",
    "Role",
    "RouteDecision",
    "effective_queue",
    "effective_queued_tokens",
    "effective_remaining_s",
    "effective_service_s",
    "eq3_of_sums",
    "is_fresh",
    "linear_attention_cost_of",
    "local_work",
    "node_load_requests",
    "pick_min",
    "prefill_candidates",
    "queue_depth",
    "require_candidates",
    "serves_prefill",
]
