"""Reports of a comparison: JSON (everything), a Markdown table, PNG plots."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentpool.sim.bounds import ClosedLoopBound

_COLUMNS = (
    ("system", "system", "{}"),
    ("req/s", "throughput_rps", "{:.3f}"),
    ("out tok/s", "output_tps", "{:.0f}"),
    ("TPS in SLO", "tps_within_slo", "{:.0f}"),
    ("TTFT mean", ("ttft_s", "mean"), "{:.2f}"),
    ("TTFT p50", ("ttft_s", "p50"), "{:.2f}"),
    ("TTFT p95", ("ttft_s", "p95"), "{:.2f}"),
    ("TTFT p99", ("ttft_s", "p99"), "{:.2f}"),
    ("TPOT mean ms", ("tpot_s", "mean"), "{:.1f}", 1000.0),
    ("E2E mean", ("e2e_s", "mean"), "{:.2f}"),
    ("E2E p95", ("e2e_s", "p95"), "{:.2f}"),
    ("hit rate", "hit_rate", "{:.3f}"),
    ("lost KV reuse", "lost_kv_reuse", "{:.2%}"),
    ("uncached tok/req", "uncached_tokens_per_request", "{:.0f}"),
    ("prefill imbalance", "prefill_imbalance", "{:.2f}"),
    ("switches", "switches", "{}"),
    ("switch mean s", "switch_mean_s", "{:.1f}"),
    ("downtime s", "switch_downtime_s", "{:.0f}"),
    ("final split", "final_split", "{}"),
    ("wall s", "wall_s", "{:.1f}"),
)


def _value(result: dict[str, Any], key: str | tuple[str, str]) -> Any:
    s = result["summary"]
    if key == "system":
        return result["system"]
    if key == "wall_s":
        return result["wall_s"]
    if key == "final_split":
        sp = s["final_split"]
        return f"{sp[0]}P{sp[1]}D" + (f"+{sp[2]}down" if len(sp) > 2 and sp[2] else "") if sp else "-"
    if isinstance(key, tuple):
        return s[key[0]][key[1]]
    return s[key]


def markdown_table(results: Sequence[dict[str, Any]]) -> str:
    header = "| " + " | ".join(c[0] for c in _COLUMNS) + " |"
    sep = "|" + "|".join("---" for _ in _COLUMNS) + "|"
    lines = [header, sep]
    for r in results:
        cells = []
        for col in _COLUMNS:
            v = _value(r, col[1])
            if len(col) > 3 and isinstance(v, float):
                v = v * col[3]
            if isinstance(v, float) and math.isnan(v):
                cells.append("-")
            else:
                cells.append(col[2].format(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def bound_line(bound: ClosedLoopBound | None, results: Sequence[dict[str, Any]]) -> str:
    if bound is None:
        return "No analytic bound for this workload (open loop, Mooncake or phased synthetic agents).\n"
    shares = ", ".join(
        f"{r['system']} {r['summary']['throughput_rps'] / bound.throughput_rps:.0%}" for r in results
    )
    return (
        f"Upper bound (Little's law over conversations, ground-truth minimal response times): "
        f"{bound.throughput_rps:.3f} req/s for {bound.agents} agents. Share of it: {shares}.\n"
    )


def markdown_report(
    title: str,
    command: str,
    scenario: dict[str, Any],
    results: Sequence[dict[str, Any]],
    bound: ClosedLoopBound | None = None,
) -> str:
    parts = [
        f"# {title}\n",
        f"Command: `{command}`\n",
        "Scenario: "
        + ", ".join(f"{k}={v}" for k, v in scenario.items() if k not in ("sim", "planner"))
        + "\n",
        f"Pool: {scenario.get('sim')}\n",
        markdown_table(results),
        bound_line(bound, results),
        "\nTimes in seconds unless noted; the measurement window excludes the warmup. Lost KV reuse is "
        "`1 - h/h*` (h* with an unlimited cache shared by all nodes and no switches, same requests). "
        "Prefill imbalance: per minute, the most loaded prefill node's mean queueing time over the mean "
        "across prefill nodes. `wall s` is the wall time of the simulation on this machine.\n",
    ]
    return "\n".join(parts)


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=1, default=float), encoding="utf-8")


def write_plots(outdir: Path, results: Sequence[dict[str, Any]], end_s: float) -> list[Path]:
    """Split over time, TTFT CDF and throughput per system, as PNG files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    written: list[Path] = []
    fig, ax = plt.subplots(figsize=(8, 4))
    for r in results:
        tl = r["split_timeline"]
        if not tl:
            continue
        xs = [row[0] / 60.0 for row in tl] + [end_s / 60.0]
        ys = [row[1] for row in tl] + [tl[-1][1]]
        ax.step(xs, ys, where="post", label=r["system"])
    ax.set_xlabel("time (min)")
    ax.set_ylabel("prefill nodes")
    ax.set_title("PD split over time")
    ax.legend(fontsize=7)
    p = outdir / "split_over_time.png"
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        t = np.sort(np.asarray(r["ttft_samples"], dtype=float))
        if len(t):
            ax.plot(t, np.arange(1, len(t) + 1) / len(t), label=r["system"])
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("CDF")
    ax.legend(fontsize=7)
    p = outdir / "ttft_cdf.png"
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)

    fig, ax = plt.subplots(figsize=(7, 4))
    names = [r["system"] for r in results]
    ax.bar(names, [r["summary"]["throughput_rps"] for r in results])
    ax.set_ylabel("requests/s")
    ax.set_title("Throughput")
    ax.tick_params(axis="x", rotation=30, labelsize=7)
    p = outdir / "throughput.png"
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)
    return written
