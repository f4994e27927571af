"""A one-node fixture shared by the node-model tests: round coefficients, times checkable by hand."""

from __future__ import annotations

from agentpool.models import DecodeModel, PrefillModel
from agentpool.node import IterationHook, Node, Role

PREFILL = PrefillModel(c0=0.01, c1=1e-4, c2=1e-8, c3=1e-5)
DENSE = DecodeModel(d0=0.02, d1=0.0, d2=0.001, experts_total=0)  # T_D(B) = 0.02 + 0.001*B


def node(
    role: Role = Role.PREFILL,
    chunk: int = 8192,
    t_acc: float = 1.0,
    on_iteration: IterationHook | None = None,
) -> Node:
    return Node(
        0,
        "n0",
        PREFILL,
        DENSE,
        role=role,
        chunk_tokens=chunk,
        t_acc=t_acc,
        gpu_cache_blocks=100,
        kv_capacity_tokens=10**9,
        on_iteration=on_iteration,
    )
