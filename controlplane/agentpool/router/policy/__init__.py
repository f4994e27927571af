"""agentpool.router.policy: pure routing policies (one plugin per module) and their contract.

See :mod:`agentpool.router.policy.contract` for the views a policy sees and the decision it returns,
:mod:`.registry` for the explicit name -> policy registry, :mod:`.decode` for decode binding.
"""

from agentpool.router.policy.contract import (
    DEFAULT_TPOT_SLO_S,
    EMPTY_QUEUE,
    NO_PREFIX,
    CachedPrefix,
    NoCandidateError,
    NodeState,
    Policy,
    PolicyContext,
    PolicyError,
    QueuedPrefill,
    RequestView,
    Role,
    RouteDecision,
    effective_queue,
    effective_remaining_s,
    is_fresh,
    prefill_candidates,
)
from agentpool.router.policy.decode import (
    DecodeBinding,
    bind_decode,
    decode_role,
    decode_room_will_free,
    kv_room_needed,
    kv_tokens_needed,
)
from agentpool.router.policy.registry import POLICIES, create_policy, policy_names

__all__ = [
    "DEFAULT_TPOT_SLO_S",
    "EMPTY_QUEUE",
    "NO_PREFIX",
    "POLICIES",
    "CachedPrefix",
    "DecodeBinding",
    "NoCandidateError",
    "NodeState",
    "Policy",
    "PolicyContext",
    "PolicyError",
    "QueuedPrefill",
    "RequestView",
    "Role",
    "RouteDecision",
    "bind_decode",
    "create_policy",
    "decode_role",
    "decode_room_will_free",
    "effective_queue",
    "effective_remaining_s",
    "is_fresh",
    "kv_room_needed",
    "kv_tokens_needed",
    "policy_names",
    "prefill_candidates",
]
