"""The node models the planner keeps (Algorithm E.3 line 1): the warmup's fit and a window's refit.

After the warmup the engines' iteration records are fitted per node (NNLS,
:func:`agentpool.models.fitting.fit_nodes`) and frozen; a node with too few records of a phase of
its own gets the fit of the whole pool's records of that phase. Each node's model then carries the
prefill ``t_bar``/``f_n`` measured in the latest window (:func:`prefill_batches_by_node`).

A window whose records leave the range a node's models were fitted on, and which they mispredict,
refits that node on the fitted records plus the window's
(:func:`agentpool.models.refit.refit_nodes`); :func:`apply_refits` takes the results in.

CPU only, no I/O: :class:`agentpool.planner.controller.PlannerController` calls these (the fits in
a worker thread) and keeps the results.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace

from agentpool.models import (
    IterationRecord,
    MoeShape,
    NodeModel,
    PrefillBatchItem,
    measure_prefill_window,
    with_window_stats,
)
from agentpool.models.fitting import MIN_OWN_RECORDS, NodeFit, fit_nodes, split_by_node
from agentpool.models.refit import NodeRecords, NodeRefit

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WarmupFit:
    """The warmup's fit of each node, its model with the warmup's ``t_bar``/``f_n``, and the records
    it was fitted on (what a later refit checks a window against)."""

    fits: dict[str, NodeFit]
    models: dict[str, NodeModel]
    records: dict[str, NodeRecords]


def fit_warmup(
    records: list[IterationRecord],
    shape: MoeShape,
    nodes: list[str] | None = None,
    priors: Mapping[str, NodeModel] | None = None,
    default_prior: NodeModel | None = None,
) -> WarmupFit:
    """Fit and freeze the models of ``nodes`` (default: every node with records) from ``records``;
    empty when there are no records to fit. ``priors``: the models used until now (the terms the
    records cannot tell keep theirs, :func:`agentpool.models.fitting.fit_nodes`); a node with none
    there takes ``default_prior`` (the pool's configured coefficients, if any). Logs each node's
    held-out error and the nodes whose phases were fitted on the whole pool's records."""
    given = dict(priors or {})
    if default_prior is not None:
        names = nodes if nodes is not None else [r.node for r in records]
        given = {**dict.fromkeys(names, default_prior), **given}
    fits = fit_nodes(records, shape, nodes=nodes, priors=given)
    pooled = [
        f"{name} ({_pooled_phases(f)})" for name, f in fits.items() if not (f.prefill_own and f.decode_own)
    ]
    if pooled:
        log.warning(
            "too few warmup records of their own (< %d) to fit these nodes' phases: fitted on every "
            "node's records of the phase: %s",
            MIN_OWN_RECORDS,
            ", ".join(pooled),
        )
    batches = prefill_batches_by_node(records)
    models: dict[str, NodeModel] = {}
    for name, f in fits.items():
        models[name] = with_window_stats(f.node_model(), measure_prefill_window(batches.get(name, [])))
        log.info(
            "fitted %s: prefill MAPE %.1f%%, decode MAPE %.1f%% on held-out records; "
            "%d prefill and %d decode records dropped as measured far too short",
            name,
            100 * f.prefill.report.mape_held_out,
            100 * f.decode.report.mape_held_out,
            f.prefill.report.records_dropped,
            f.decode.report.records_dropped,
        )
    records_by_node = {n: NodeRecords(f.prefill_records, f.decode_records) for n, f in fits.items()}
    return WarmupFit(fits=fits, models=models, records=records_by_node)


def apply_refits(
    refits: dict[str, NodeRefit],
    models: dict[str, NodeModel],
    fitted_records: dict[str, NodeRecords],
    fits: dict[str, NodeFit],
) -> list[str]:
    """Take in the refits that changed a node: its model, the records it is now fitted on and its
    fit (a phase not refitted keeps its fit); updates the three maps in place and returns the
    changed nodes, in ``refits``' order."""
    changed = [name for name, r in refits.items() if r.changed]
    for name in changed:
        r = refits[name]
        models[name] = r.model(models[name])
        fitted_records[name] = r.records()
        old = fits.get(name)
        if old is not None:
            fits[name] = replace(
                old,
                prefill=old.prefill if r.prefill.fit is None else r.prefill.fit,
                decode=old.decode if r.decode.fit is None else r.decode.fit,
            )
    return changed


def prefill_batches_by_node(records: list[IterationRecord]) -> dict[str, list[tuple[PrefillBatchItem, ...]]]:
    """Each node's prefill batches, in order."""
    return {node: [r.batch for r in rs] for node, rs in split_by_node(records)[0].items()}


def _pooled_phases(f: NodeFit) -> str:
    """The phases of a node's fit made on the whole pool's records, e.g. ``prefill+decode``."""
    return "+".join(ph for ph, own in (("prefill", f.prefill_own), ("decode", f.decode_own)) if not own)
