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


_NARROW = (
    ("system", "system", "{}"),
    ("req/s", "throughput_rps", "{:.3f}"),
    ("TTFT p50 / p95 s", None, ""),
    ("TPOT ms", ("tpot_s", "mean"), "{:.1f}", 1000.0),
    ("E2E mean s", ("e2e_s", "mean"), "{:.2f}"),
    ("lost reuse", "lost_kv_reuse", "{:.1%}"),
    ("switches", None, ""),
    ("final split", "final_split", "{}"),
)


def summary_table(results: Sequence[dict[str, Any]]) -> str:
    """A narrow table for a terminal (details in results.json): switches after the warmup / in all."""
    lines = ["| " + " | ".join(c[0] for c in _NARROW) + " |", "|" + "|".join("---" for _ in _NARROW) + "|"]
    for r in results:
        s = r["summary"]
        cells = []
        for col in _NARROW:
            if col[0].startswith("TTFT"):
                cells.append(f"{s['ttft_s']['p50']:.2f} / {s['ttft_s']['p95']:.1f}")
            elif col[0] == "switches":
                cells.append(f"{s['switches']} / {s.get('switches_total', s['switches'])}")
            else:
                assert col[1] is not None
                v = _value(r, col[1])
                if len(col) > 3 and isinstance(v, float):
                    v = v * col[3]
                cells.append("-" if isinstance(v, float) and math.isnan(v) else col[2].format(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def describe(scenario: dict[str, Any]) -> str:
    """The scenario in words (the exact values are in results.json)."""
    sim = scenario["sim"]
    if scenario.get("arrival_per_min") is not None:
        load = f"open loop, {scenario['arrival_per_min']:g} agents/min (at most {scenario['max_agents']})"
    else:
        load = f"{scenario['agents']} concurrent agents (closed loop)"
    pauses = (
        "recorded pauses"
        if scenario.get("max_pause_s") is None
        else f"pauses capped at {scenario['max_pause_s']:g} s"
    )
    trace = scenario.get("trace") or "bundled sample"
    convs = scenario.get("conversations")
    return (
        f"Workload: {scenario['workload']} ({trace}"
        + (f", first {convs} conversations" if convs else "")
        + f"), {load}, {pauses}, {scenario['shared_prefix_tokens']}-token shared prefix, seed "
        f"{scenario['seed']}.\n\nPool: {sim['nodes']} nodes of {scenario['preset']} (ground truth: "
        f"{sim.get('truth', 'roofline')}); planned systems start at {sim['prefill_nodes']}P"
        f"{sim['nodes'] - sim['prefill_nodes']}D, static ones run "
        f"{scenario.get('static_prefill_nodes') or sim['prefill_nodes']} prefill nodes. "
        f"{scenario['warmup_s'] / 60:g} min warmup, {scenario['duration_s'] / 60:g} min measured.\n"
    )


def bound_line(bound: ClosedLoopBound | None, results: Sequence[dict[str, Any]]) -> str:
    if bound is None:
        return "No analytic bound for this workload (open loop, Mooncake or phased synthetic agents).\n"

    def share(summary: dict[str, Any]) -> str:
        own = float(summary.get("bound_rps", bound.little_rps))
        return f"{own:.3f} req/s ({float(summary['throughput_rps']) / own:.0%} of it)"

    shares = ", ".join(f"{r['system']} {share(r['summary'])}" for r in results)
    if bound.ideal_window_rps is None:
        return f"Upper bound (Little's law over conversations, {bound.agents} agents): {shares}.\n"
    return (
        f"Upper bound of each run (every request from the window's start at its minimal response "
        f"time, `agentpool.sim.bounds`): {shares}. Reference, not a bound: the ideal replay from time "
        f"0 completes {bound.ideal_window_rps:.3f} req/s in the window ({bound.agents} agents).\n"
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
        describe(scenario),
        summary_table(results),
        bound_line(bound, results),
        "\nMeasured after the warmup. Lost reuse: `1 - h/h*`, h* with an unlimited cache shared by all "
        "nodes and no switches. Switches: after the warmup / in all. Every figure (means, P99s, hit "
        "rates, imbalance, wall times, timelines) is in results.json.\n",
    ]
    return "\n".join(parts)


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=1, default=float), encoding="utf-8")


def write_plots(outdir: Path, results: Sequence[dict[str, Any]], end_s: float) -> list[Path]:
    """Throughput over time, TTFT CDF and each system's split timeline in its own panel (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    written: list[Path] = []
    fig, ax = plt.subplots(figsize=(8, 4))
    for r in results:
        per_min = np.asarray(r.get("completed_per_minute", []), dtype=float)
        if len(per_min):
            ax.plot(np.arange(len(per_min)) + 0.5, per_min / 60.0, label=r["system"], lw=1.2)
    ax.set_xlabel("time (min)")
    ax.set_ylabel("completed requests/s (per minute)")
    ax.set_title("Throughput over time")
    ax.legend(fontsize=7)
    written.append(_save(fig, plt, outdir / "throughput.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        t = np.sort(np.asarray(r["ttft_samples"], dtype=float))
        if len(t):
            ax.plot(t, np.arange(1, len(t) + 1) / len(t), label=r["system"])
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("CDF")
    ax.legend(fontsize=7)
    written.append(_save(fig, plt, outdir / "ttft_cdf.png"))

    fig, axes = plt.subplots(
        len(results), 1, figsize=(8, 1.2 + 1.1 * len(results)), sharex=True, squeeze=False
    )
    for ax, r in zip(axes[:, 0], results, strict=True):
        tl = r["split_timeline"]
        if tl:
            xs = [row[0] / 60.0 for row in tl] + [end_s / 60.0]
            ax.step(xs, [row[1] for row in tl] + [tl[-1][1]], where="post", label="prefill")
            ax.step(xs, [row[2] for row in tl] + [tl[-1][2]], where="post", label="decode")
        else:  # a colocated pool: every node serves both phases
            ax.text(0.5, 0.5, "no prefill/decode split", ha="center", va="center", fontsize=7,
                    transform=ax.transAxes)  # fmt: skip
        ax.set_ylabel(r["system"], fontsize=7, rotation=0, ha="right")
        ax.tick_params(labelsize=7)
        top = max((row[1] + row[2] + row[3] for row in tl), default=1)
        ax.set_ylim(-0.5, top + 0.5)
        ax.yaxis.get_major_locator().set_params(integer=True)
    if axes[0, 0].get_legend_handles_labels()[0]:  # nothing to name without a split
        axes[0, 0].legend(fontsize=7, loc="upper right")
    axes[0, 0].set_title("Nodes per phase over time")
    axes[-1, 0].set_xlabel("time (min)")
    written.append(_save(fig, plt, outdir / "split_over_time.png"))
    return written


def _save(fig: Any, plt: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
