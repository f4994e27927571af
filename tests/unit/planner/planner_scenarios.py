"""Workloads and node sets shared by the planner tests (not a test module).

The node model is GLM-like on one node (Eq. 1/2 coefficients of the order of Figure 5). Two agent
workloads after KV reuse, on 9 nodes:

- Putnam-like: long proofs, decode-heavy: best split 2P7D at 300 requests in decode;
- OSWorld-like: screenshots and long uncached inputs, short actions, prefill-heavy: best 6P3D.
"""

from __future__ import annotations

import numpy as np

from agentpool.kv import Role
from agentpool.models import DecodeModel, NodeModel, PrefillModel, Work, WorkSlice
from agentpool.planner.core import PlannerNode

NODE = NodeModel(
    prefill=PrefillModel(c0=0.015, c1=4e-5, c2=2e-10, c3=1e-6),
    decode=DecodeModel(d0=0.012, d1=0.018, d2=2.5e-4, experts_active=8, experts_total=256),
    t_bar=8192.0,
    f_restore=0.1,
)
PUTNAM = (Work(t_uc=6000, t_c=30000, t_out=2000), 300.0)
OSWORLD = (Work(t_uc=12000, t_c=80000, t_out=300), 60.0)


def nodes(
    prefill: int,
    total: int = 9,
    model: NodeModel = NODE,
    pinned: frozenset[str] = frozenset(),
    draining: frozenset[str] = frozenset(),
) -> tuple[PlannerNode, ...]:
    """Nodes n0..n{total-1}; the first ``prefill`` serve prefill."""
    return tuple(
        PlannerNode(
            name=f"n{i}",
            model=model,
            role=Role.PREFILL if i < prefill else Role.DECODE,
            pinned=f"n{i}" in pinned,
            draining=f"n{i}" in draining,
        )
        for i in range(total)
    )


def noisy_slices(base: tuple[Work, float], m: int, noise: float, rng: np.random.Generator) -> list[WorkSlice]:
    """``m`` slices around ``base`` with independent multiplicative noise on every component."""
    work, q = base
    out = []
    for _ in range(m):
        f = 1.0 + noise * rng.standard_normal(4)
        out.append(
            WorkSlice(
                work=Work(
                    t_uc=work.t_uc * f[0], t_c=work.t_c * f[1], t_out=work.t_out * f[2], t_acc=work.t_acc
                ),
                decode_occupancy=q * f[3],
            )
        )
    return out


def oracle_throughput(prefill: int, total: int, s: WorkSlice, model: NodeModel = NODE) -> float:
    """Eq. 5 written out with the scalar NodeModel methods (independent of the vectorized core)."""
    decode = total - prefill
    mu_p = prefill * model.prefill_rate(s.work)
    mu_d = decode * model.decode_rate(s.work, s.decode_occupancy / decode)
    return min(mu_p, mu_d)


def best_prefill_count(slices: list[WorkSlice], total: int = 9, model: NodeModel = NODE) -> int:
    """The prefill count whose mean oracle throughput over ``slices`` is largest."""
    means = {
        p: sum(oracle_throughput(p, total, s, model) for s in slices) / len(slices) for p in range(1, total)
    }
    return max(means, key=lambda p: means[p])
