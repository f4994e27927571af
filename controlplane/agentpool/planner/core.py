"""Pure planner core (evolving-infra §5.2, Algorithm E.3 outer loop, lines 15-29): no I/O, no clock.

Input: a :class:`PlannerInput` (nodes with their frozen models, current roles and states; the
window's slices of average work ``w̄_i`` and decode occupancy ``q̄_i`` with their times; the time of
the evaluation and of the last switch). Output: a :class:`SplitDecision` that says which nodes change
role and why, with the per-slice gains and standard error of every candidate, so it can be logged
and put in status.

The algorithm:

1. Skip the window while a node still drains from the last switch (line 16), or while less than
   the cooldown has passed since the switch completed (the last moved node serves its new phase;
   a switch whose drain outlasts the window therefore still holds the next decision).
   "The planner skips the 120 s after each switch" (App. E.3): the slices that start before the
   cooldown ended are left out of the gain test, so the transient right after a switch (queues
   re-forming on the moved nodes) is not taken for the workload; a window right after a switch
   thus has fewer than ``m`` slices.
2. For every prefill count ``p`` other than the current one, within the min nodes per phase,
   form the candidate that changes the fewest nodes: ``|p - |P||`` unpinned nodes move. Which
   nodes move is fixed by a deterministic ranking (see :func:`_mover_order`).
3. Gains ``g_i = Θ(candidate; w̄_i, q̄_i) - Θ(current; w̄_i, q̄_i)`` (Eq. 6) on every slice.
4. A candidate qualifies if ``mean(g) > z·sd(g)/sqrt(m)`` (z = 2; sd is the sample standard
   deviation, ddof = 1), its mean gain is at least a fraction ``r`` of the current split's mean
   predicted throughput (``mean(g) > r·mean(Θ_cur)``, ``PlannerPolicy.min_relative_gain``), and its
   decode nodes hold the running contexts wherever the current split's do (below). Switch to the
   qualifying candidate with the largest mean gain, except that moving more nodes must earn its
   keep too: the chosen one is the qualifying candidate with the fewest moves whose mean gain is
   within ``r·mean(Θ_cur)`` of the largest; ties go to the candidate with the larger mean gain, then
   to the smaller prefill count. With ``r = 0`` this is the paper's test and choice exactly.

Why the relative floor (``r``; the paper's test is step 4 with ``r = 0``, and it leaves room for it:
§5.2 asks that a switch be "statistically better" because each switch has a cost). At light load
Θ's decode term is ``q̄/T_D(q̄/|D|)``: nearly the rate the pool already serves, whatever the split.
A split with one more decode node lowers ``T_D`` a little on every slice, so its gain is tiny
(0.02-0.03 req/s on a Θ of 1.6-2.6 req/s in the simulated CC runs at 90-108 agents) but almost
constant, and its standard error smaller still: the test passes, the planner gives up prefill
headroom for 1-2% of predicted capacity, and the next burst of long prompts queues. The same holds
between candidates: at 1,200 s of CC at 108 agents (seed 2) 1P8D, 2P7D and 3P6D all qualified with
mean gains 0.501, 0.498 and 0.420 req/s; the largest moved the most nodes and left one prefill node.

Decode capacity needs KV room. A node with a known decode KV capacity (``PlannerNode.kv_capacity_tokens``,
tokens of GPU memory for running requests) runs at most ``capacity / kv`` requests at once, where
``kv = t_uc + t_c + t_out`` is the slice's average request's KV (prompt and output, the room the
router reserves): its ``mu_D`` uses ``B = min(q̄/|D|, capacity / kv)``. A split *holds* a slice when
its decode nodes' capacities add up to at least ``q̄ · kv``; a candidate that leaves more slices
short of KV room than the current split does is not feasible and never qualifies (its evidence is
still reported). Nodes without a capacity (``inf``, the default) are not limited: Eq. 4 as written.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from agentpool.kv import Role
from agentpool.models import NodeModel, WorkSlice
from agentpool.planner.throughput import FloatArray, NodeArrays, SliceArrays, split_throughput


class Outcome(StrEnum):
    """What the planner decided for a window."""

    SWITCH = "switch"
    HOLD = "hold"  # candidates evaluated, none statistically better
    COOLDOWN = "cooldown"  # too soon after the last switch; nothing evaluated
    DRAINING = "draining"  # a node still drains from the last switch; nothing evaluated
    TOO_FEW_SLICES = "too-few-slices"  # fewer than 2 slices with data: no standard error


@dataclass(frozen=True, slots=True)
class PlannerNode:
    """A node as the planner sees it: its frozen model (with this window's t_bar, f_n) and state."""

    name: str
    model: NodeModel
    role: Role  # PREFILL or DECODE: the planner runs once disaggregation has started
    draining: bool = False
    pinned: bool = False
    kv_capacity_tokens: float = math.inf  # decode KV room of its GPU memory (inf: not limited)

    def __post_init__(self) -> None:
        if self.role is Role.BOTH:
            raise ValueError(f"node {self.name!r} serves both phases: the planner places prefill or decode")
        if not self.kv_capacity_tokens > 0:
            raise ValueError(f"node {self.name}: KV capacity must be positive, got {self.kv_capacity_tokens}")


@dataclass(frozen=True, slots=True)
class PlannerPolicy:
    """The limits of the outer loop (Algorithm E.3; the paper's runs use a 120 s cooldown, z = 2)."""

    cooldown_s: float = 120.0
    min_prefill: int = 1
    min_decode: int = 1
    significance: float = 2.0
    min_relative_gain: float = 0.03  # r: a switch must gain r x the current split's mean Θ (see top)

    def __post_init__(self) -> None:
        if self.cooldown_s < 0:
            raise ValueError(f"cooldown must be >= 0 s, got {self.cooldown_s}")
        if self.min_prefill < 1 or self.min_decode < 1:
            raise ValueError("a disaggregated pool needs at least one node per phase")
        if self.significance <= 0:
            raise ValueError(f"significance must be positive, got {self.significance}")
        if not 0.0 <= self.min_relative_gain < 1.0:
            raise ValueError(f"min relative gain must be in [0, 1), got {self.min_relative_gain}")


@dataclass(frozen=True, slots=True)
class LastSwitch:
    """The pool's last switch: when the planner applied it, and when it completed (the last moved
    node served its new phase; None while one still drains). Times in seconds, the planner's clock."""

    applied_at: float
    settled_at: float | None = None

    def __post_init__(self) -> None:
        if self.settled_at is not None and self.settled_at < self.applied_at:
            raise ValueError(f"a switch completes after it is applied: {self}")

    def quiet_from(self, cooldown_s: float) -> float:
        """When the cooldown ends: ``cooldown_s`` after the switch completed (or was applied)."""
        return (self.applied_at if self.settled_at is None else self.settled_at) + cooldown_s


@dataclass(frozen=True, slots=True)
class PlannerInput:
    """Everything one evaluation needs, as a plain value.

    ``now``: the end of the window (s). ``last_switch``: None when the pool has not switched since
    disaggregation started; otherwise the slices need their times (``WorkSlice.start``).
    """

    nodes: tuple[PlannerNode, ...]
    slices: tuple[WorkSlice, ...]
    now: float = 0.0
    last_switch: LastSwitch | None = None

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"node names must be unique: {sorted(names)}")
        for n in self.nodes:
            pm, dm = n.model.prefill, n.model.decode
            if pm.c0 + pm.c1 + pm.c2 <= 0 or dm.d0 + dm.d1 + dm.d2 <= 0:
                raise ValueError(
                    f"node {n.name}: a model with zero time per request predicts infinite throughput"
                )
        sw = self.last_switch
        if sw is not None:
            if self.now < sw.applied_at or (sw.settled_at is not None and self.now < sw.settled_at):
                raise ValueError(f"the last switch {sw} is after the evaluation at {self.now}")
            untimed = sum(1 for x in self.slices if x.start is None)
            if untimed:
                raise ValueError(f"{untimed} slices without times: the cooldown cannot be left out")


@dataclass(frozen=True, slots=True)
class Candidate:
    """One candidate split and its evidence (Eq. 6 gains per slice, mean, standard error)."""

    prefill_count: int
    to_prefill: tuple[str, ...]
    to_decode: tuple[str, ...]
    gains: tuple[float, ...]
    mean_gain: float
    std_error: float
    qualifies: bool
    kv_short_slices: int = 0  # slices whose running contexts its decode nodes cannot hold

    @property
    def moves(self) -> int:
        return len(self.to_prefill) + len(self.to_decode)


@dataclass(frozen=True, slots=True)
class SplitDecision:
    """The planner's answer for one window.

    ``prefill``/``decode`` are the split after the decision (the current one unless SWITCH);
    ``to_prefill``/``to_decode`` the nodes whose desired role changes; ``excluded_slices`` the
    slices left out because they started within the cooldown after the last switch.
    """

    outcome: Outcome
    reason: str
    prefill: tuple[str, ...]
    decode: tuple[str, ...]
    current_throughput: tuple[float, ...] = ()
    candidates: tuple[Candidate, ...] = ()
    chosen: Candidate | None = None
    to_prefill: tuple[str, ...] = field(default=())
    to_decode: tuple[str, ...] = field(default=())
    excluded_slices: int = 0

    @property
    def best(self) -> Candidate | None:
        """The candidate with the largest mean gain, qualifying or not."""
        return max(self.candidates, key=_rank_key, default=None)

    @property
    def near_switch(self) -> bool:
        """No switch, but the best candidate's mean gain exceeded one standard error."""
        best = self.best
        return self.outcome is Outcome.HOLD and best is not None and best.mean_gain > best.std_error


def plan(inp: PlannerInput, policy: PlannerPolicy) -> SplitDecision:
    """Evaluate one window (Algorithm E.3 lines 16-28) and decide whether to switch the split."""
    prefill = tuple(sorted(n.name for n in inp.nodes if n.role is Role.PREFILL))
    decode = tuple(sorted(n.name for n in inp.nodes if n.role is Role.DECODE))

    def hold(outcome: Outcome, reason: str) -> SplitDecision:
        return SplitDecision(outcome=outcome, reason=reason, prefill=prefill, decode=decode)

    draining = sorted(n.name for n in inp.nodes if n.draining)
    if draining:
        return hold(Outcome.DRAINING, f"nodes still draining from the last switch: {', '.join(draining)}")
    kept, excluded = inp.slices, 0
    sw = inp.last_switch
    if sw is not None:
        quiet = sw.quiet_from(policy.cooldown_s)
        if inp.now < quiet:
            since = inp.now - (sw.applied_at if sw.settled_at is None else sw.settled_at)
            return hold(
                Outcome.COOLDOWN,
                f"{since:.0f} s since the last switch completed, cooldown is {policy.cooldown_s:.0f} s",
            )
        kept = tuple(x for x in inp.slices if x.start is not None and x.start >= quiet)
        excluded = len(inp.slices) - len(kept)
    m = len(kept)
    if m < 2:
        left_out = f" ({excluded} left out: within the cooldown after the last switch)" if excluded else ""
        return dataclasses.replace(
            hold(
                Outcome.TOO_FEW_SLICES,
                f"{m} slice(s) with requests{left_out}; the gain test needs at least 2",
            ),
            excluded_slices=excluded,
        )

    by_role = {
        r: sorted((n for n in inp.nodes if n.role is r), key=lambda n: n.name)
        for r in (Role.PREFILL, Role.DECODE)
    }
    cur_p, cur_d = by_role[Role.PREFILL], by_role[Role.DECODE]
    s = SliceArrays.of(kept)
    p_arrays = NodeArrays.of([n.model for n in cur_p], [n.kv_capacity_tokens for n in cur_p])
    d_arrays = NodeArrays.of([n.model for n in cur_d], [n.kv_capacity_tokens for n in cur_d])
    # KV room: what the running contexts need per slice, and the decode capacity of each split
    kv_demand = s.occupancy * s.kv_per_request
    p_caps = [n.kv_capacity_tokens for n in cur_p]
    d_caps = [n.kv_capacity_tokens for n in cur_d]
    d_room = sum(d_caps)
    current_short = _kv_short(d_room, kv_demand)
    p_rates = p_arrays.prefill_rates(s)  # (|P|, m)
    d_as_p_rates = d_arrays.prefill_rates(s)  # (|D|, m): decode nodes' prefill rates if moved
    prefill_sum = p_rates.sum(axis=0)
    current = np.minimum(prefill_sum, _decode_sum(d_arrays, s, len(cur_d)))
    floor = policy.min_relative_gain * float(current.mean())  # the least gain worth a switch (req/s)

    # Indices (into cur_d / cur_p) of the unpinned nodes in the order they would move.
    up = _mover_order(cur_d, d_as_p_rates, d_arrays, s, len(cur_d), toward=Role.PREFILL)
    down = _mover_order(cur_p, p_rates, p_arrays, s, len(cur_d), toward=Role.DECODE)
    # Prefill sums of the movers, cumulative: candidate j moves the first j of them.
    up_prefill = np.cumsum(d_as_p_rates[up], axis=0)
    down_prefill = np.cumsum(p_rates[down], axis=0)
    n_total = len(inp.nodes)
    lo = max(policy.min_prefill, len(cur_p) - len(down))
    hi = min(n_total - policy.min_decode, len(cur_p) + len(up))

    candidates: list[Candidate] = []
    to_p: tuple[str, ...]
    to_d: tuple[str, ...]
    for p in range(lo, hi + 1):
        if p == len(cur_p):
            continue
        if p > len(cur_p):
            j = p - len(cur_p)
            new_prefill = prefill_sum + up_prefill[j - 1]
            rates = d_arrays.decode_rates(s, len(cur_d) - j)
            new_decode = rates.sum(axis=0) - rates[up[:j]].sum(axis=0)
            to_p, to_d = tuple(cur_d[i].name for i in up[:j]), ()
            moved = {int(i) for i in up[:j]}
            room = sum(c for i, c in enumerate(d_caps) if i not in moved)  # no inf - inf
        else:
            j = len(cur_p) - p
            new_prefill = prefill_sum - down_prefill[j - 1]
            k = len(cur_d) + j
            moved_decode = p_arrays.decode_rates(s, k)[down[:j]].sum(axis=0)
            new_decode = _decode_sum(d_arrays, s, k) + moved_decode
            to_p, to_d = (), tuple(cur_p[i].name for i in down[:j])
            room = d_room + sum(p_caps[i] for i in down[:j])
        gains = np.minimum(new_prefill, new_decode) - current
        mean = float(gains.mean())
        se = float(gains.std(ddof=1)) / math.sqrt(m)
        short = _kv_short(room, kv_demand)
        candidates.append(
            Candidate(
                prefill_count=p,
                to_prefill=tuple(sorted(to_p)),
                to_decode=tuple(sorted(to_d)),
                gains=tuple(float(g) for g in gains),
                mean_gain=mean,
                std_error=se,
                qualifies=mean > policy.significance * se and mean > floor and short <= current_short,
                kv_short_slices=short,
            )
        )

    throughput = tuple(float(x) for x in current)
    qualifying = [c for c in candidates if c.qualifies]
    if not qualifying:
        best = max(candidates, key=_rank_key, default=None)
        why = (
            "no candidate split within the min nodes per phase and pinned nodes"
            if best is None
            else f"best candidate {best.prefill_count}P: its decode nodes cannot hold the running "
            f"contexts on {best.kv_short_slices} of {m} slices (the current split: {current_short})"
            if best.kv_short_slices > current_short and best.mean_gain > policy.significance * best.std_error
            else f"best candidate {best.prefill_count}P has mean gain {best.mean_gain:.4g}/s, "
            f"not above {policy.significance:g} x standard error {best.std_error:.4g}/s"
            if best.mean_gain <= policy.significance * best.std_error
            else f"best candidate {best.prefill_count}P has mean gain {best.mean_gain:.4g}/s, not above "
            f"{policy.min_relative_gain:g} x the current split's throughput {float(current.mean()):.4g}/s"
        )
        return SplitDecision(
            Outcome.HOLD, why, prefill, decode, throughput, tuple(candidates), excluded_slices=excluded
        )
    top = max(c.mean_gain for c in qualifying)
    chosen = min((c for c in qualifying if c.mean_gain >= top - floor), key=_fewer_moves_key)
    new_p = tuple(sorted((set(prefill) - set(chosen.to_decode)) | set(chosen.to_prefill)))
    new_d = tuple(sorted((set(decode) - set(chosen.to_prefill)) | set(chosen.to_decode)))
    return SplitDecision(
        outcome=Outcome.SWITCH,
        reason=(
            f"{len(prefill)}P{len(decode)}D -> {len(new_p)}P{len(new_d)}D: mean gain "
            f"{chosen.mean_gain:.4g}/s > {policy.significance:g} x standard error {chosen.std_error:.4g}/s"
            + (
                f" and > {policy.min_relative_gain:g} x throughput {float(current.mean()):.4g}/s"
                if policy.min_relative_gain > 0
                else ""
            )
        ),
        prefill=new_p,
        decode=new_d,
        current_throughput=throughput,
        candidates=tuple(candidates),
        chosen=chosen,
        to_prefill=chosen.to_prefill,
        to_decode=chosen.to_decode,
        excluded_slices=excluded,
    )


def initial_roles(
    names: Sequence[str], pinned: Mapping[str, Role], prefill: int, policy: PlannerPolicy
) -> dict[str, Role]:
    """The split disaggregation starts from (Algorithm E.3 line 1): ``prefill`` prefill nodes.

    Pinned nodes keep their role; the unpinned ones fill the remaining prefill places in name
    order and serve decode otherwise. Raises ValueError when the pins make the split impossible
    or it breaks the min nodes per phase.
    """
    unknown = sorted(set(pinned) - set(names))
    if unknown:
        raise ValueError(f"pinned nodes that are not in the pool: {unknown}")
    free = sorted(n for n in names if n not in pinned)
    need = prefill - sum(1 for r in pinned.values() if r is Role.PREFILL)
    if not 0 <= need <= len(free):
        raise ValueError(f"cannot start with {prefill} prefill nodes when {dict(pinned)} are pinned")
    roles = dict(pinned) | {n: Role.PREFILL if i < need else Role.DECODE for i, n in enumerate(free)}
    decode = sum(1 for r in roles.values() if r is Role.DECODE)
    if prefill < policy.min_prefill or decode < policy.min_decode:
        raise ValueError(
            f"initial split {prefill}P{decode}D breaks the minimum of "
            f"{policy.min_prefill} prefill and {policy.min_decode} decode nodes"
        )
    return roles


def _rank_key(c: Candidate) -> tuple[float, int, int]:
    """Largest mean gain first; then fewer moves; then the smaller prefill count."""
    return (c.mean_gain, -c.moves, -c.prefill_count)


def _fewer_moves_key(c: Candidate) -> tuple[int, float, int]:
    """Among candidates whose gains are within the relative floor of the best: fewer moves first;
    then the larger mean gain; then the smaller prefill count."""
    return (c.moves, -c.mean_gain, c.prefill_count)


def _kv_short(room: float, demand: FloatArray) -> int:
    """Slices on which decode KV room ``room`` (tokens, summed over a split's decode nodes) is less
    than the running contexts need."""
    if room == math.inf:
        return 0
    return int(np.count_nonzero(demand > room))


def _decode_sum(arrays: NodeArrays, s: SliceArrays, decode_nodes: int) -> FloatArray:
    """Sum of ``mu_D`` over all rows of ``arrays`` with ``B = q̄/decode_nodes``."""
    if decode_nodes == 0:
        return np.zeros_like(s.occupancy)
    result: FloatArray = arrays.decode_rates(s, decode_nodes).sum(axis=0)
    return result


def _mover_order(
    nodes: Sequence[PlannerNode],
    prefill_rates: FloatArray,
    arrays: NodeArrays,
    s: SliceArrays,
    decode_nodes: int,
    toward: Role,
) -> npt.NDArray[np.intp]:
    """Indices of the unpinned ``nodes`` in the order they move to ``toward``.

    A node's prefill strength relative to its decode speed is its mean prefill rate times its
    mean decode iteration time at the current batch. Nodes move to prefill strongest first and to
    decode weakest first; equal nodes move in name order, so decisions are deterministic.
    """
    if not nodes:
        return np.zeros(0, dtype=np.intp)
    batch = s.occupancy / float(max(decode_nodes, 1))
    strength = prefill_rates.mean(axis=1) * arrays.decode_iteration_times(batch).mean(axis=1)
    sign = -1.0 if toward is Role.PREFILL else 1.0
    ranked = sorted(range(len(nodes)), key=lambda i: (sign * float(strength[i]), nodes[i].name))
    return np.array([i for i in ranked if not nodes[i].pinned], dtype=np.intp)


__all__ = [
    "Candidate",
    "LastSwitch",
    "Outcome",
    "PlannerInput",
    "PlannerNode",
    "PlannerPolicy",
    "SplitDecision",
    "initial_roles",
    "plan",
    "split_throughput",
]
