"""The report's plots for a pool without a prefill/decode split (a colocated live replay)."""

from __future__ import annotations

import warnings
from pathlib import Path

from agentpool.sim.report import write_plots


def test_plots_of_a_run_without_a_split_draw_without_warnings(tmp_path: Path) -> None:
    result = {
        "system": "live",
        "completed_per_minute": [10, 12],
        "ttft_samples": [0.1, 0.2, 0.4],
        "split_timeline": [],  # colocated: no split to draw
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "No artists with labels found" fails here
        written = write_plots(tmp_path, [result], end_s=120.0)
    assert sorted(p.name for p in written) == ["split_over_time.png", "throughput.png", "ttft_cdf.png"]
    assert all(p.stat().st_size > 0 for p in written)
