"""The `spec.model` and `spec.engine` sections: what is served, by which backend, where."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field

from agentpool.api.base import ApiModel, CrossFieldRule
from agentpool.api.values import ByteQuantity, Quantity, byte_quantity

Backend = Literal["sglang", "sim"]
BACKENDS: tuple[str, ...] = get_args(Backend)

GPU_RESOURCE = "nvidia.com/gpu"


class ExpertsSpec(ApiModel):
    """Mixture-of-experts routing shape, used by the decode model's `phi(B)` (Eq. 2)."""

    active: int = Field(ge=1)
    """Routed experts each token reads (`k`), e.g. 8."""
    total: int = Field(ge=1)
    """Routed experts per MoE layer (`E`), e.g. 128."""

    rules = (
        CrossFieldRule(
            cel="self.active <= self.total",
            message="experts.active cannot exceed experts.total",
            holds=lambda m: m.active <= m.total,
            field_path=".active",
        ),
    )


class IterationModelSpec(ApiModel):
    """Eq. 1 and Eq. 2 of evolving-infra §5.1 for one node of this model on the pool's GPUs, in
    seconds: from a profile of the engine, or a paper's fit. The router predicts with it until the
    planner's first fit reaches it, and the planner's fits keep the terms its records cannot tell
    apart (decode batches that span less than 4x, as at light load; prefill terms the records
    barely exercise). Leave it out to have the router start from generic defaults and the fits
    use the records alone."""

    c0: float = Field(ge=0)
    """Prefill: fixed seconds per iteration."""
    c1: float = Field(ge=0)
    """Prefill: seconds per uncached token."""
    c2: float = Field(ge=0)
    """Prefill: seconds per attention pair (an uncached token times the context before it)."""
    c3: float = Field(ge=0)
    """Prefill: seconds per restored (fetched) token."""
    d0: float = Field(ge=0)
    """Decode: fixed seconds per iteration."""
    d1: float = Field(ge=0)
    """Decode: seconds to read every routed expert (times the fraction `phi(B)` a batch reads)."""
    d2: float = Field(ge=0)
    """Decode: seconds per running request."""


class ModelSpec(ApiModel):
    """The model the pool serves."""

    name: str = Field(min_length=1, max_length=253)
    """Model to load: a Hugging Face repository id (`Qwen/Qwen3-Coder-30B-A3B-Instruct`) or a path
    inside the engine image."""
    served_name: str | None = Field(default=None, min_length=1, max_length=253)
    """Model name clients send in the OpenAI API; defaults to `name`."""
    context_length: int | None = Field(default=None, ge=1)
    """Maximum context length in tokens (prompt and output); defaults to the model's own. Engines
    get it as SGLang's `--context-length` (`sim` engines refuse longer requests likewise, 400) when
    they start; the router answers a longer prompt with 400 `context_length_exceeded` and gives it to
    clients as `max_model_len` at `GET /v1/models`."""
    experts: ExpertsSpec | None = None
    """Set for mixture-of-experts models; leave out for dense models (then `phi(B) = 1`)."""
    iteration_model: IterationModelSpec | None = None
    """Iteration-time coefficients to start from (the prior of the planner's online fit)."""

    @property
    def client_name(self) -> str:
        """The model name clients use."""
        return self.served_name or self.name

    def iteration_coefficients(self) -> dict[str, float] | None:
        """`iterationModel` as `c0`..`d2` -> seconds (None when not given)."""
        return None if self.iteration_model is None else self.iteration_model.model_dump()


class Toleration(ApiModel):
    """A Kubernetes toleration, copied onto the engine pods."""

    key: str | None = Field(default=None, max_length=317)
    """Taint key; leave out with operator `Exists` to tolerate every taint."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """`Equal` matches `value`; `Exists` matches any value."""
    value: str | None = Field(default=None, max_length=63)
    """Taint value to match with operator `Equal`."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; leave out to match all effects."""
    toleration_seconds: int | None = Field(default=None, ge=0)
    """How long a `NoExecute` taint is tolerated before eviction."""

    rules = (
        CrossFieldRule(
            cel="self.operator != 'Exists' || !has(self.value)",
            message="a toleration with operator Exists cannot have a value",
            holds=lambda m: m.operator != "Exists" or m.value is None,
            field_path=".value",
        ),
    )


class ResourceRequirements(ApiModel):
    """CPU, memory and other resources of each engine container (GPUs come from `gpusPerNode`)."""

    requests: dict[str, Quantity] | None = Field(default=None, max_length=64)
    """Resources the scheduler reserves, e.g. `{cpu: "32", memory: 512Gi}`."""
    limits: dict[str, Quantity] | None = Field(default=None, max_length=64)
    """Upper bounds enforced at run time."""

    rules = (
        CrossFieldRule(
            cel=(
                f"(!has(self.requests) || !('{GPU_RESOURCE}' in self.requests)) && "
                f"(!has(self.limits) || !('{GPU_RESOURCE}' in self.limits))"
            ),
            message=f"set GPUs with spec.engine.gpusPerNode, not as {GPU_RESOURCE} in resources",
            holds=lambda m: GPU_RESOURCE not in (m.requests or {}) and GPU_RESOURCE not in (m.limits or {}),
        ),
    )


class SchedulingSpec(ApiModel):
    """Where engine pods may run; copied onto the engine pod template."""

    node_selector: dict[str, str] = Field(default={})
    """Node labels an engine pod requires, e.g. `{nvidia.com/gpu.product: NVIDIA-H200}`."""
    tolerations: list[Toleration] = Field(default=[], max_length=64)
    """Taints the engine pods tolerate."""
    affinity: dict[str, Any] | None = None
    """A Kubernetes `Affinity` object, passed through unchanged (kube-apiserver validates it when the
    operator creates the pods)."""
    resources: ResourceRequirements = Field(default=ResourceRequirements())
    """CPU and memory requests and limits of the engine container."""


class EngineSpec(ApiModel):
    """The engine every node runs: one pod per node, switching between prefill and decode in place."""

    backend: Backend
    """`sglang` (upstream SGLang on GPUs) or `sim` (a CPU engine with the same API whose iteration
    times come from the models; no GPUs)."""
    image: str = Field(min_length=1, max_length=512)
    """Container image of the engine agent and its backend."""
    args: list[str] = Field(default=[])
    """Extra command-line arguments passed to the backend (e.g. `--tp-size 4` for SGLang)."""
    gpus_per_node: int = Field(default=0, ge=0, le=16)
    """GPUs each engine pod requests (`nvidia.com/gpu`); at least 1 for `sglang`, 0 for `sim`."""
    host_kv_size: ByteQuantity
    """Host memory each node gives the shared KV pool (`256Gi`, or an integer of bytes); 0 disables
    the node's host tier."""
    scheduling: SchedulingSpec = Field(default=SchedulingSpec())
    """Node selector, tolerations, affinity and resources of the engine pods."""

    rules = (
        CrossFieldRule(
            cel="self.backend != 'sglang' || self.gpusPerNode >= 1",
            message="the sglang backend needs spec.engine.gpusPerNode of at least 1",
            holds=lambda m: m.backend != "sglang" or m.gpus_per_node >= 1,
            field_path=".gpusPerNode",
        ),
        CrossFieldRule(
            cel="self.backend != 'sim' || self.gpusPerNode == 0",
            message="the sim backend uses no GPUs: set spec.engine.gpusPerNode to 0",
            holds=lambda m: m.backend != "sim" or m.gpus_per_node == 0,
            field_path=".gpusPerNode",
        ),
    )

    @property
    def host_kv_bytes(self) -> int:
        """`hostKvSize` in bytes."""
        return byte_quantity(self.host_kv_size)
