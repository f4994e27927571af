"""Pool shape and run settings shared by every system of a comparison."""

from __future__ import annotations

from dataclasses import dataclass

from agentpool.models import IterationCoefficients, NodeModel, decode_shape

DECODE_BINDINGS = ("prefill-end", "prefill-start", "dispatch")
TRUTHS = ("roofline", "equations")


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Pool shape and run settings shared by every system of a comparison."""

    nodes: int = 9
    prefill_nodes: int = 6
    block_size: int = 512  # KV block of the simulation: trace blocks (64 tokens) grouped by 8
    slo_ttft_base_s: float = 2.0
    slo_ttft_per_token_s: float = 1e-4
    slo_tpot_s: float = 0.1
    host_evict_fraction: float = 0.25  # evict in batches: the order is recomputed per batch
    occupancy_sample_s: float = 5.0
    # what the planner's q̄ counts: "decode" (requests decoding, the paper's wording) or "inflight"
    # (requests routed and not finished: the decode demand if prefill kept up). See planners.py.
    occupancy: str = "inflight"
    # when a disaggregated request is bound to a decode node: "prefill-start" (Algorithm E.3 line 13
    # and the live router: when the prefill node reports that the request started) or "prefill-end"
    # (when its first token is out) or "dispatch" (SGLang PD disaggregation: the gateway picks the
    # decode node with the prefill node and the decode node reserves the request's KV before its
    # prefill is queued; a request with no decode room waits before the prefill queue). A system
    # with its own ``SystemConfig.decode_binding`` uses that instead.
    decode_binding: str = "prefill-start"
    # what iterations really take: "roofline" (the preset's architecture and GPU model, independent
    # of Eq. 1-4) or "equations" (Eq. 1/2 with the preset's coefficients, the former simulator)
    truth: str = "roofline"
    noise: float | None = None  # relative noise of each iteration time; None: the preset's
    # one GPU memory per node: the prefix cache holds what running requests leave (False: two
    # pools of gpu_kv_tokens each, the former simulator)
    shared_gpu_memory: bool = True
    host_kv_tokens: int | None = None  # host tier per node; None: the preset's
    # fetches and P->D hand-overs share per-node NIC and host-memory bandwidth (False: each takes
    # its uncontended time, the former simulator)
    network: bool = True
    # Eq. 1/2's coefficients the routers and planners start from (a manifest's
    # spec.model.iterationModel); None: the preset's (the paper's fit). Not the truth.
    node_model: IterationCoefficients | None = None

    def starting_model(self, preset: NodeModel) -> NodeModel:
        """What routers and planners start from: ``preset`` (the preset's coefficients), or
        ``node_model``'s coefficients with the preset's MoE shape, ``t_bar`` and ``f_restore``."""
        if self.node_model is None:
            return preset
        return self.node_model.node_model(decode_shape(preset.decode), preset.t_bar, preset.f_restore)

    def __post_init__(self) -> None:
        if self.nodes < 1 or not 0 <= self.prefill_nodes <= self.nodes:
            raise ValueError(f"need 1 <= nodes and 0 <= prefill_nodes <= nodes, got {self}")
        if self.occupancy not in ("decode", "inflight"):
            raise ValueError(f"occupancy must be 'decode' or 'inflight', got {self.occupancy!r}")
        if self.decode_binding not in DECODE_BINDINGS:
            raise ValueError(f"decode_binding must be one of {DECODE_BINDINGS}, got {self.decode_binding!r}")
        if self.truth not in TRUTHS:
            raise ValueError(f"truth must be one of {TRUTHS}, got {self.truth!r}")
        if self.noise is not None and not 0.0 <= self.noise < 1.0:
            raise ValueError(f"noise must be in [0, 1), got {self.noise}")
        if self.host_kv_tokens is not None and self.host_kv_tokens < 0:
            raise ValueError(f"host_kv_tokens must be >= 0, got {self.host_kv_tokens}")
