"""Calibration presets: a node's iteration-time coefficients and memory, as data (``data/presets.json``).

Each preset lists its sources; replace the file's values with fitted ones when real GPU
measurements exist. Validation is a pydantic model at this edge; the simulator gets plain values.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

from pydantic import BaseModel, ConfigDict, Field

from agentpool.models import DecodeModel, PrefillModel


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
    kv_bytes_per_token: int = Field(gt=0)
    pd_transfer_bytes_per_s: float = Field(gt=0)
    switch_in_place_s: float = Field(ge=0)
    relaunch_s: float = Field(ge=0)

    def prefill_model(self) -> PrefillModel:
        p = self.prefill
        return PrefillModel(p.c0, p.c1, p.c2, p.c3)

    def decode_model(self) -> DecodeModel:
        d = self.decode
        return DecodeModel(d.d0, d.d1, d.d2, d.experts_active, d.experts_total, d.t_fwd)

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
