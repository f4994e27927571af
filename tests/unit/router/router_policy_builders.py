"""Shared builders for the router policy tests."""

from __future__ import annotations

import dataclasses

from agentpool.models import DecodeModel, NodeModel, PrefillModel, Work
from agentpool.router.policy import CachedPrefix, NodeState, QueuedPrefill, RequestView, Role

# c0 = 10 ms per iteration of 8192 new tokens, 50 us per uncached token, attention negligible:
# a 4096-token uncached prefill takes 0.005 + 0.2048 = ~0.21 s.
MODEL = NodeModel(
    prefill=PrefillModel(c0=0.01, c1=5e-5, c2=1e-10, c3=1e-7),
    decode=DecodeModel(d0=0.01, d1=0.005, d2=1e-4),
    t_bar=8192.0,
)


def node(
    nid: str,
    *,
    role: Role = Role.PREFILL,
    queue: list[Work] | None = None,
    unreported: list[Work] | None = None,
    remaining: float = 0.0,
    running_decode: int = 0,
    kv_room: int = 1_000_000,
    kv_used: int = 0,
    age: float | None = 0.1,
    accepting: bool = True,
    draining: bool = False,
    waiting: int = 0,
) -> NodeState:
    return NodeState(
        node_id=nid,
        role=role,
        model=MODEL,
        remaining_batch_s=remaining,
        queue=QueuedPrefill.of(queue or []),
        unreported=QueuedPrefill.of(unreported or []),
        running_decode=running_decode,
        kv_room_tokens=kv_room,
        kv_used_tokens=kv_used,
        accepting=accepting,
        draining=draining,
        report_age_s=age,
        decode_waiting_tokens=waiting,
    )


def request(
    prompt: int,
    *,
    local: dict[str, int] | None = None,
    gpu: dict[str, int] | None = None,
    cluster: int | None = None,
    turn: int = 1,
    new_turn: int = 0,
    out: int = 100,
    rid: str = "r",
) -> RequestView:
    local = local or {}
    gpu = gpu or {}
    prefixes = {n: CachedPrefix(gpu=gpu.get(n, t), total=t) for n, t in local.items()}
    return RequestView(
        request_id=rid,
        prompt_tokens=prompt,
        turn=turn,
        new_turn_tokens=new_turn,
        local_prefix=prefixes,
        cluster_prefix=max([cluster or 0, *local.values()]),
        expected_output_tokens=out,
    )


def uncached(tokens: int, cached: int = 0) -> Work:
    return Work(t_uc=float(tokens), t_c=float(cached))


def send(n: NodeState, w: Work) -> NodeState:
    """``n`` after the router sent it ``w`` (not yet reported by the engine)."""
    return dataclasses.replace(n, unreported=n.unreported.add(w))
