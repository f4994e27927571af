"""Calibration presets: a node's iteration-time coefficients and memory, as data (``data/presets.json``).

Each preset lists its sources; replace the file's values with fitted ones when real GPU
measurements exist. Validation is a pydantic model at this edge; the simulator gets plain values.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

from pydantic import BaseModel, ConfigDict, Field

from agentpool.models import DecodeModel, PrefillBatchItem, PrefillModel
from agentpool.node.roofline import Architecture, Calibration, Hardware, Roofline


class _Prefill(BaseModel):
    model_config = ConfigDict(extra="forbid")
    c0: float = Field(ge=0)
    c1: float = Field(ge=0)
    c2: float = Field(ge=0)
    c3: float = Field(ge=0)


class _Decode(BaseModel):
    model_config = ConfigDict(extra="forbid")
    d0: float = Field(ge=0)
    d1: float = Field(ge=0)
    d2: float = Field(ge=0)
    experts_active: int = Field(ge=0)
    experts_total: int = Field(ge=0)
    t_fwd: float = Field(gt=0)


class _Architecture(BaseModel):
    model_config = ConfigDict(extra="forbid")
    layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    dense_params: float = Field(gt=0)
    expert_params: float = Field(ge=0)
    experts_total: int = Field(ge=0)
    experts_active: int = Field(ge=0)
    weight_bytes_per_param: float = Field(gt=0)
    kv_bytes_per_token: float = Field(gt=0)
    pair_flops: float = Field(ge=0)
    context_bytes_per_token: float = Field(ge=0)
    sparse_top_k: int = Field(ge=0)
    sparse_pair_flops: float = Field(ge=0)
    t_fwd: float = Field(gt=0)
    activation_bytes: float = Field(gt=0)


class _Hardware(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpus: int = Field(gt=0)
    flops_per_gpu: float = Field(gt=0)
    hbm_bytes_per_s: float = Field(gt=0)
    link_bytes_per_s: float = Field(gt=0)
    link_latency_s: float = Field(ge=0)
    host_to_gpu_bytes_per_s: float = Field(gt=0)


class _Calibration(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gemm_efficiency: float = Field(gt=0, le=1)
    attention_efficiency: float = Field(gt=0, le=1)
    hbm_efficiency: float = Field(gt=0, le=1)
    prefill_fixed_s: float = Field(ge=0)
    decode_fixed_s: float = Field(ge=0)
    decode_per_request_s: float = Field(ge=0)


class CalibrationPoint(BaseModel):
    """A published figure the ground truth must meet within ``tolerance`` (relative)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    what: str
    source: str
    seconds: float = Field(gt=0)
    tolerance: float = Field(gt=0)
    batch: list[tuple[int, int, int]] | None = None  # prefill: (uncached, cached, restored) per request
    running: int | None = None  # decode
    context_tokens: int | None = None
    extra_context_tokens: int | None = None  # decode: the seconds are the time this many more add

    def model_seconds(self, truth: Roofline) -> float:
        if self.batch is not None:
            return truth.prefill_s([PrefillBatchItem(float(u), float(c), float(r)) for u, c, r in self.batch])
        if self.running is None or self.context_tokens is None:
            raise ValueError(f"calibration point {self.what!r} needs a batch or running and context_tokens")
        base = truth.decode_s(self.running, float(self.context_tokens))
        if self.extra_context_tokens is None:
            return base
        return truth.decode_s(self.running, float(self.context_tokens + self.extra_context_tokens)) - base


class _Truth(BaseModel):
    model_config = ConfigDict(extra="forbid")
    architecture: _Architecture
    hardware: _Hardware
    calibration: _Calibration
    noise: float = Field(ge=0, lt=1)  # relative standard deviation of one iteration's time
    calibration_points: list[CalibrationPoint]


class Preset(BaseModel):
    """One node class."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    description: str
    sources: list[str]
    prefill: _Prefill
    decode: _Decode
    t_acc: float = Field(gt=0)
    chunk_tokens: int = Field(gt=0)
    gpu_kv_tokens: int = Field(gt=0)
    host_kv_tokens: int = Field(gt=0)
    # the model's context length (prompt + output); None: no limit below one node's GPU KV
    context_tokens: int | None = Field(default=None, gt=0)
    kv_bytes_per_token: int = Field(gt=0)
    pd_transfer_bytes_per_s: float = Field(gt=0)  # a node's NIC, each way (GPU-to-GPU RDMA)
    host_link_bytes_per_s: float = Field(gt=0)  # a node's host-memory KV path for fetches (App. D.6)
    switch_in_place_s: float = Field(ge=0)
    relaunch_s: float = Field(ge=0)
    truth: _Truth

    def roofline(self) -> Roofline:
        """The ground-truth iteration times of this node class (noiseless)."""
        t = self.truth
        return Roofline(
            Architecture(**t.architecture.model_dump()),
            Hardware(**t.hardware.model_dump()),
            Calibration(**t.calibration.model_dump()),
        )

    def prefill_model(self) -> PrefillModel:
        p = self.prefill
        return PrefillModel(p.c0, p.c1, p.c2, p.c3)

    def decode_model(self) -> DecodeModel:
        d = self.decode
        return DecodeModel(d.d0, d.d1, d.d2, d.experts_active, d.experts_total, d.t_fwd)

    @property
    def max_request_tokens(self) -> int:
        """The longest request (prompt + output) a node of this class serves: the model's context,
        and never more than its GPU KV holds (a longer request could never be decoded there)."""
        return min(self.gpu_kv_tokens, self.context_tokens or self.gpu_kv_tokens)

    def handover_s(self, tokens: int) -> float:
        """GPU-to-GPU P->D transfer time of ``tokens`` tokens of KV."""
        return tokens * self.kv_bytes_per_token / self.pd_transfer_bytes_per_s


@cache
def presets() -> dict[str, Preset]:
    text = resources.files("agentpool.sim").joinpath("data/presets.json").read_text(encoding="utf-8")
    return {name: Preset.model_validate(v) for name, v in json.loads(text).items()}


def preset(name: str) -> Preset:
    try:
        return presets()[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(presets())}") from None
