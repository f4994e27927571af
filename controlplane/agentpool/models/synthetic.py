"""Iteration records generated from known models with multiplicative noise.

This is what a simulated engine reports: each iteration's time is the model's prediction times
``1 + noise * N(0, 1)`` (clipped so times stay positive). Batches follow chunked prefill: requests
of 1-8, uncached tokens up to the chunk budget, cached prefixes log-uniform up to ``max_cached``,
part of each prefix restored from host memory. Pure: the random generator is passed in.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from agentpool.models.iteration import NodeModel, PrefillBatchItem
from agentpool.models.records import DecodeIterationRecord, PrefillIterationRecord


@dataclass(frozen=True, slots=True)
class SyntheticWorkload:
    """The range of batches the generator draws from."""

    chunk_tokens: int = 8192
    max_requests: int = 8
    max_cached: int = 262_144
    max_running: int = 256
    restore_fraction: float = 0.5  # fraction of records whose prefix is partly restored from host
    # An effect Eq. 2 leaves out (App. B.4): reading the running requests' KV adds time per context
    # token (about 1e-9 s, 1 ms per million tokens, for GLM-5.2 on GB300). Contexts are drawn
    # uniformly from 4K to ``max_context`` tokens. 0 keeps the records exactly of the model's form.
    decode_s_per_context_token: float = 0.0
    max_context: int = 131_072


def noisy(seconds: float, noise: float, rng: np.random.Generator) -> float:
    """``seconds * (1 + noise*N(0,1))``, kept above 10% of ``seconds``."""
    return float(seconds * max(0.1, 1.0 + noise * rng.standard_normal()))


def prefill_records(
    node: str,
    model: NodeModel,
    count: int,
    noise: float,
    rng: np.random.Generator,
    workload: SyntheticWorkload = SyntheticWorkload(),
    start: float = 0.0,
    spacing: float = 1.0,
) -> list[PrefillIterationRecord]:
    """``count`` prefill iterations of ``node``, stamped ``start, start+spacing, ...``."""
    return list(_prefill(node, model, count, noise, rng, workload, start, spacing))


def _prefill(
    node: str,
    model: NodeModel,
    count: int,
    noise: float,
    rng: np.random.Generator,
    workload: SyntheticWorkload,
    start: float,
    spacing: float,
) -> Iterator[PrefillIterationRecord]:
    for k in range(count):
        n_req = int(rng.integers(1, workload.max_requests + 1))
        budget = int(rng.integers(64 * n_req, workload.chunk_tokens + 1))
        shares = rng.dirichlet(np.ones(n_req))
        items = []
        for share in shares:
            t_uc = max(1, int(share * budget))
            t_c = int(np.exp(rng.uniform(0.0, np.log(workload.max_cached)))) - 1
            restored = rng.uniform() < workload.restore_fraction
            t_rst = int(t_c * rng.uniform()) if restored else 0
            items.append(PrefillBatchItem(t_uc=t_uc, t_c=t_c, t_rst=t_rst))
        batch = tuple(items)
        seconds = noisy(model.prefill.iteration_time(batch), noise, rng)
        yield PrefillIterationRecord(node=node, at=start + k * spacing, batch=batch, seconds=seconds)


def decode_records(
    node: str,
    model: NodeModel,
    count: int,
    noise: float,
    rng: np.random.Generator,
    workload: SyntheticWorkload = SyntheticWorkload(),
    start: float = 0.0,
    spacing: float = 1.0,
) -> list[DecodeIterationRecord]:
    """``count`` decode iterations of ``node`` with 1..max_running requests (log-uniform)."""
    records = []
    for k in range(count):
        running = int(np.exp(rng.uniform(0.0, np.log(workload.max_running + 1))))
        running = min(max(running, 1), workload.max_running)
        seconds = model.decode.iteration_time(running)
        if workload.decode_s_per_context_token > 0:
            contexts = rng.integers(4096, workload.max_context + 1, size=running)
            seconds += workload.decode_s_per_context_token * float(contexts.sum())
        seconds = noisy(seconds, noise, rng)
        records.append(
            DecodeIterationRecord(node=node, at=start + k * spacing, running=running, seconds=seconds)
        )
    return records
