"""Ground-truth iteration times from a model's architecture and a node's GPUs (a roofline model).

Independent of Eq. 1-4 (which agentpool fits): the time of an iteration is built from what it
computes and what it reads.

Prefill over a batch of chunks (``T`` uncached tokens, ``A`` query-key pairs, ``R`` restored
tokens)::

    linear   = max(2 * active_params * T / F,  weight_bytes(phi(T)) / M)   # GEMMs, or reading weights
    attention = (A * pair_flops + S * sparse_pair_flops) / F_attn         # S: sparse top-k pairs
    comm     = 2 * layers * (latency + T * hidden * act_bytes * (g-1)/g / link)   # TP all-reduces
    restore  = R * kv_bytes_per_token / host_to_gpu
    T_P      = prefill_fixed + linear + attention + comm + restore

Decode of ``B`` running requests holding ``C`` context tokens in all (``t_fwd`` tokens per request
per iteration under MTP)::

    gemm      = max(weight_bytes(phi(t_fwd * B)) / M,  2 * active_params * t_fwd * B / F)
    read      = C * context_bytes_per_token
                + t_fwd * B * min(top_k, C / B) * kv_bytes_per_token      # sparse attention only
    attention = read / M + t_fwd * C * pair_flops / F_attn                # KV reads, then scores
    T_D       = decode_fixed + gemm + attention + comm + per_request * B

with ``phi(n) = 1 - (1 - k/E)^n`` the fraction of routed experts ``n`` tokens select (App. B.3),
``F = gpus * flops * gemm_efficiency``, ``F_attn`` likewise with the attention efficiency and
``M = gpus * hbm * hbm_efficiency``. Where Eq. 1 and Eq. 2 differ from it (the form agentpool fits):
small prefill chunks are bound by reading the weights, not linear in tokens; sparse attention's
core pairs saturate at ``top_k`` per token; TP communication grows with tokens; decode grows with
the running requests' context (a little under sparse attention, a lot under full attention).

The efficiencies and fixed/per-request costs are the calibration (what a roofline leaves out);
``bench.bench_sim_truth`` prints the calibration points against the papers' figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentpool.models import PrefillBatchItem
from agentpool.models.work import attention_pairs


@dataclass(frozen=True, slots=True)
class Architecture:
    """What a model computes and reads per token (sizes in parameters and bytes, all layers)."""

    layers: int
    hidden: int
    dense_params: float  # read in full every iteration: attention, shared experts, embeddings, head
    expert_params: float  # all routed experts of all layers (0 for a dense model)
    experts_total: int  # E (0: dense)
    experts_active: int  # k
    weight_bytes_per_param: float
    kv_bytes_per_token: float  # the full KV of one token (all layers)
    pair_flops: float  # FLOPs per query-key pair over the whole context (full attention or indexer)
    context_bytes_per_token: float  # bytes a decode iteration reads per context token
    sparse_top_k: int = 0  # sparse attention: each query attends its top-k tokens in full (0: none)
    sparse_pair_flops: float = 0.0  # FLOPs per top-k pair
    t_fwd: float = 1.0  # tokens per request per decode iteration (MTP: 1 + drafts)
    activation_bytes: float = 2.0

    def __post_init__(self) -> None:
        if self.layers <= 0 or self.hidden <= 0 or self.dense_params <= 0 or self.t_fwd <= 0:
            raise ValueError(f"layers, hidden, dense params and t_fwd must be positive: {self}")
        if self.experts_total and not 0 < self.experts_active <= self.experts_total:
            raise ValueError(f"need 0 < experts_active <= experts_total: {self}")

    @property
    def active_params(self) -> float:
        if not self.experts_total:
            return self.dense_params + self.expert_params
        return self.dense_params + self.expert_params * self.experts_active / self.experts_total

    def expert_fraction(self, tokens: float) -> float:
        """phi: expected fraction of routed experts that ``tokens`` tokens select (App. B.3)."""
        if not self.experts_total:
            return 1.0
        miss: float = (1.0 - self.experts_active / self.experts_total) ** tokens
        return 1.0 - miss

    def weight_bytes(self, tokens: float) -> float:
        return (self.dense_params + self.expert_fraction(tokens) * self.expert_params) * (
            self.weight_bytes_per_param
        )


@dataclass(frozen=True, slots=True)
class Hardware:
    """One node's GPUs (peak figures per GPU) and its host link."""

    gpus: int
    flops_per_gpu: float  # dense peak in the GEMM data type
    hbm_bytes_per_s: float  # per GPU
    link_bytes_per_s: float  # per GPU, intra-node interconnect (tensor-parallel all-reduce)
    link_latency_s: float  # latency of one all-reduce
    host_to_gpu_bytes_per_s: float  # restoring KV from host memory, per node

    def __post_init__(self) -> None:
        if self.gpus <= 0 or min(self.flops_per_gpu, self.hbm_bytes_per_s, self.host_to_gpu_bytes_per_s) <= 0:
            raise ValueError(f"GPU count, FLOP/s and bandwidths must be positive: {self}")


@dataclass(frozen=True, slots=True)
class Calibration:
    """What the roofline leaves out, set so that the model meets published figures."""

    gemm_efficiency: float
    attention_efficiency: float
    hbm_efficiency: float
    prefill_fixed_s: float  # launch, scheduling, sampling of one prefill iteration
    decode_fixed_s: float
    decode_per_request_s: float  # sampling, drafting and bookkeeping per running request

    def __post_init__(self) -> None:
        effs = (self.gemm_efficiency, self.attention_efficiency, self.hbm_efficiency)
        if not all(0 < e <= 1 for e in effs):
            raise ValueError(f"efficiencies must be in (0, 1]: {self}")
        if min(self.prefill_fixed_s, self.decode_fixed_s, self.decode_per_request_s) < 0:
            raise ValueError(f"fixed costs must be non-negative: {self}")


class Roofline:
    """Iteration times of ``arch`` on ``hw`` (see the module docstring); noiseless and pure."""

    __slots__ = ("_attn_flops", "_comm_fixed", "_comm_per_token", "_flops", "_mem", "arch", "cal", "hw")

    def __init__(self, arch: Architecture, hw: Hardware, cal: Calibration) -> None:
        self.arch, self.hw, self.cal = arch, hw, cal
        g = hw.gpus
        self._flops = g * hw.flops_per_gpu * cal.gemm_efficiency
        self._attn_flops = g * hw.flops_per_gpu * cal.attention_efficiency
        self._mem = g * hw.hbm_bytes_per_s * cal.hbm_efficiency
        if g > 1:
            self._comm_fixed = 2 * arch.layers * hw.link_latency_s
            self._comm_per_token = (
                2 * arch.layers * arch.hidden * arch.activation_bytes * (g - 1) / g / hw.link_bytes_per_s
            )
        else:
            self._comm_fixed = self._comm_per_token = 0.0

    def prefill_s(self, batch: Sequence[PrefillBatchItem]) -> float:
        a = self.arch
        t = pairs = sparse = restored = 0.0
        for item in batch:
            t += item.t_uc
            pairs += attention_pairs(item.t_uc, item.t_c)
            restored += item.t_rst
            if a.sparse_top_k:
                sparse += item.t_uc * min(float(a.sparse_top_k), item.t_c + 0.5 * item.t_uc)
        linear = max(2.0 * a.active_params * t / self._flops, a.weight_bytes(t) / self._mem)
        attention = (pairs * a.pair_flops + sparse * a.sparse_pair_flops) / self._attn_flops
        comm = self._comm_fixed + self._comm_per_token * t
        restore = restored * a.kv_bytes_per_token / self.hw.host_to_gpu_bytes_per_s
        return self.cal.prefill_fixed_s + linear + attention + comm + restore

    def decode_s(self, running: int, context_tokens: float) -> float:
        if running <= 0:
            return 0.0
        a = self.arch
        tokens = a.t_fwd * running
        gemm = max(a.weight_bytes(tokens) / self._mem, 2.0 * a.active_params * tokens / self._flops)
        read = context_tokens * a.context_bytes_per_token
        if a.sparse_top_k:
            read += tokens * min(float(a.sparse_top_k), context_tokens / running) * a.kv_bytes_per_token
        attention = read / self._mem + a.t_fwd * context_tokens * a.pair_flops / self._attn_flops
        comm = self._comm_fixed + self._comm_per_token * tokens
        return self.cal.decode_fixed_s + gemm + attention + comm + self.cal.decode_per_request_s * running
