"""Decode binding for disaggregated pools (evolving-infra App. E.3, line 13).

When the prefill of a request starts, bind it to the decode node that has KV room for the request
(prompt plus expected output tokens) and the fewest running requests; ties go to the node with the
most KV room, then the smallest id. Nodes that are draining or not accepting are skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

from agentpool.router.policy.contract import NodeState, PolicyContext, RequestView, Role, is_fresh

_RUNNING = attrgetter("running_decode")
_ROOM = attrgetter("kv_room_tokens")
_ID = attrgetter("node_id")


@dataclass(frozen=True, slots=True)
class DecodeBinding:
    node_id: str
    reason: str


def kv_room_needed(prompt_tokens: int, expected_output_tokens: int) -> int:
    """KV tokens a decode node must have free to take a request: its prompt plus its expected output."""
    return prompt_tokens + expected_output_tokens


def kv_tokens_needed(request: RequestView) -> int:
    return kv_room_needed(request.prompt_tokens, request.expected_output_tokens)


def decode_role(nodes: Sequence[NodeState]) -> Role:
    """The role that decodes a prefilled request: DECODE while any node has it (serving or switching
    into it); BOTH once none has, i.e. the pool went colocated (the planner's warmup) while the
    request was in prefill: a colocated node decodes it from the handed-over KV."""
    return Role.DECODE if any(n.role is Role.DECODE for n in nodes) else Role.BOTH


def bind_decode(
    request: RequestView, nodes: Sequence[NodeState], ctx: PolicyContext, role: Role = Role.DECODE
) -> DecodeBinding | None:
    """The ``role`` node (decode by default) for ``request``, or ``None`` when none has room for it.

    A node's running-decode count from a stale report (older than ``ctx.max_report_age_s``) is still
    used: decode binding has no other load signal, and the router adds its own bindings to it.
    """
    need = kv_tokens_needed(request)
    fits = [
        n for n in nodes if n.role is role and n.accepting and not n.draining and n.kv_room_tokens >= need
    ]
    if not fits:
        return None
    # min of (running, -room, id), one key at a time: few nodes are left after the first
    fewest = min(map(_RUNNING, fits))
    fits = [n for n in fits if n.running_decode == fewest]
    if len(fits) > 1:
        most = max(map(_ROOM, fits))
        fits = [n for n in fits if n.kv_room_tokens == most]
    best = fits[0] if len(fits) == 1 else min(fits, key=_ID)
    stale = "" if is_fresh(best, ctx) else ", stale report"
    return DecodeBinding(
        best.node_id, f"kv room {best.kv_room_tokens} >= {need}, {best.running_decode} running{stale}"
    )


def decode_room_will_free(request: RequestView, nodes: Sequence[NodeState], role: Role = Role.DECODE) -> bool:
    """Whether waiting for decode KV room can end: some decode node big enough for the request (its
    KV in use plus its room is at least the need) either holds KV that frees as its decodes end
    (decodes running or KV in use) or is switching into decode (draining toward the decode role).

    A request for which this holds keeps waiting however long that takes (up to the router's
    ``decodeWaitMax``): a switch that leaves one decode node busy with long prompts, or whose new
    decode nodes are still draining their prefills, fails no request. ``role``: as for
    :func:`bind_decode`. When it does not hold (no
    decode node, none big enough, nothing that would free room) ``decodeWait`` bounds the wait.
    """
    need = kv_tokens_needed(request)
    return any(
        n.role is role
        and n.kv_used_tokens + n.kv_room_tokens >= need
        and (n.draining or n.running_decode > 0 or n.kv_used_tokens > 0)
        for n in nodes
    )
