"""The planner's fitted per-node models, pushed to every router (evolving-infra §5.1, §5.3 Eq. 7).

``PUT {router}/agentpool/v1/models`` with a :class:`ModelSet`; ``GET`` answers the router's current
one (``{"version": null, ...}`` before the first push). The router predicts each node's TTFT with
that node's own model (coefficients fitted by NNLS in the warmup, ``t_bar_n`` and ``f_n``
remeasured every window); a node that is not in the set keeps the router's configured
``nodeModel`` (the prior).

Versions: the planner numbers its sets with an increasing integer (milliseconds of its wall clock
at the push, and at least one more than its previous set, so a restarted planner continues above
the sets it pushed before). A router takes a set only if its version is higher than the one it
holds and answers ``409`` otherwise; a restarted router holds none and takes the next push. The
planner learns each router's version from its work batches (``WorkBatch.models_version``) and
pushes again to a router that is behind, so every replica converges to the same set.

The same fields describe a model in the planner's saved state (:mod:`agentpool.planner.state`).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from agentpool.models import DecodeModel, NodeModel, PrefillModel

MODELS_PATH = "/agentpool/v1/models"
MAX_NODES = 100_000


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class WireNodeModel(_Wire):
    """Eq. 1 (``c0``-``c3``) and Eq. 2 (``d0``-``d2``, MoE shape) of one node, with its window's
    ``t_bar`` (new tokens per prefill iteration) and ``f_restore`` (``f_n``)."""

    c0: float = Field(ge=0)
    c1: float = Field(ge=0)
    c2: float = Field(ge=0)
    c3: float = Field(ge=0)
    d0: float = Field(ge=0)
    d1: float = Field(ge=0)
    d2: float = Field(ge=0)
    experts_active: int = Field(ge=0)
    experts_total: int = Field(ge=0)
    t_fwd: float = Field(gt=0)
    t_bar: float = Field(gt=0)
    f_restore: float = Field(ge=0, le=1)

    @staticmethod
    def of(m: NodeModel) -> WireNodeModel:
        p, d = m.prefill, m.decode
        return WireNodeModel(
            c0=p.c0, c1=p.c1, c2=p.c2, c3=p.c3, d0=d.d0, d1=d.d1, d2=d.d2,
            experts_active=d.experts_active, experts_total=d.experts_total, t_fwd=d.t_fwd,
            t_bar=m.t_bar, f_restore=m.f_restore,
        )  # fmt: skip

    def node_model(self) -> NodeModel:
        """The plain model; ValueError when the coefficients are inconsistent (e.g. k > E)."""
        return NodeModel(
            prefill=PrefillModel(self.c0, self.c1, self.c2, self.c3),
            decode=DecodeModel(
                self.d0, self.d1, self.d2, self.experts_active, self.experts_total, self.t_fwd
            ),
            t_bar=self.t_bar,
            f_restore=self.f_restore,
        )


class ModelSet(_Wire):
    """Every fitted node's model at one version. ``fitted_at``: wall-clock time of the fit (s)."""

    version: int = Field(ge=1)
    fitted_at: float = Field(ge=0)
    models: dict[str, WireNodeModel] = Field(max_length=MAX_NODES)


class ModelSetStatus(_Wire):
    """What a router answers to ``GET``/``PUT``: the version it holds and the nodes it applies to."""

    version: int | None = None
    nodes: list[str] = Field(default_factory=list)
