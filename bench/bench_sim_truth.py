"""The simulator's ground truth against the papers' figures, and Eq. 1/2 against the ground truth.

``python -m bench.bench_sim_truth [--write]`` prints, per node preset:

- each calibration point: the published figure, the roofline's value and the residual;
- decode iteration times over running requests and context (the term Eq. 2 omits);
- the error of the preset's Eq. 1/2 coefficients (the paper's fit, agentpool's prior) against the
  truth on the Fig. 5-like grid of :mod:`agentpool.sim.fiterror`.

``--write`` stores the output as ``bench/results/sim_truth.md``.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

from agentpool.sim.fiterror import fit_error
from agentpool.sim.presets import presets

RESULTS = Path(__file__).resolve().parent / "results"


def report() -> str:
    out = io.StringIO()
    w = out.write
    w("# Ground truth of the simulated nodes\n\nCommand: `python -m bench.bench_sim_truth --write`\n\n")
    for name, p in presets().items():
        truth = p.roofline()
        w(f"## {name}\n\n{p.description}\n\n")
        points = p.truth.calibration_points
        if points:
            w("| calibration point | published | roofline | residual | tolerance | source |\n")
            w("|---|---|---|---|---|---|\n")
            for c in points:
                got = c.model_seconds(truth)
                w(
                    f"| {c.what} | {1e3 * c.seconds:.2f} ms | {1e3 * got:.2f} ms | "
                    f"{100 * (got / c.seconds - 1):+.2f}% | {100 * c.tolerance:.0f}% | {c.source} |\n"
                )
        else:
            w("No published iteration times for this model and GPU: the calibration is assumed.\n")
        w("\nDecode iteration (ms) by running requests (rows) and context per request (columns):\n\n")
        contexts = (4096, 16384, 65536)
        w("| running | " + " | ".join(f"{c // 1024}K" for c in contexts) + " | Eq. 2 (preset) |\n")
        w("|---|" + "---|" * (len(contexts) + 1) + "\n")
        eq = p.decode_model()
        for b in (1, 8, 16, 32, 64):
            cells = [
                f"{1e3 * truth.decode_s(b, float(b * c)):.1f}" if b * c <= p.gpu_kv_tokens else "(no room)"
                for c in contexts
            ]
            w(f"| {b} | " + " | ".join(cells) + f" | {1e3 * eq.iteration_time(b):.1f} |\n")
        err = fit_error(truth, p.prefill_model(), p.decode_model(), p.gpu_kv_tokens)
        w(
            "\nThe preset's Eq. 1/2 coefficients against the truth: prefill "
            f"{100 * err.prefill_mean:.1f}% mean error ({100 * err.prefill_max:.1f}% max) on single "
            f"requests, {100 * err.batch_mean:.1f}% on batches of 2-8 chunks; decode "
            f"{100 * err.decode_mean:.1f}% mean ({100 * err.decode_max:.1f}% max).\n\n"
        )
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_sim_truth", description=__doc__)
    parser.add_argument("--write", action="store_true", help="write bench/results/sim_truth.md")
    args = parser.parse_args(argv)
    text = report()
    print(text)
    if args.write:
        (RESULTS / "sim_truth.md").write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
