"""`agentpool simulate -f POOL.yaml --trace ...` from the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from local_trace import write_small_trace

pytestmark = pytest.mark.integration
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "pool-sim.yaml"


def test_simulate_a_manifest_on_a_trace(tmp_path: Path) -> None:
    trace = write_small_trace(tmp_path / "trace.jsonl", sessions=6)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "agentpool.cli", "simulate", "-f", str(EXAMPLE), "--trace", str(trace),
         "--agents", "4", "--warmup", "10", "--duration", "60", "--block-tokens", "64",
         "--shared-prefix", "128",
         "--systems", "static-cache-aware", "--out", str(out), "--no-plots", "--quiet"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    results = json.loads((out / "results.json").read_text())
    assert [r["system"] for r in results["results"]] == ["agentpool", "static-cache-aware"]
    assert results["scenario"]["sim"]["nodes"] == 6 and results["scenario"]["sim"]["prefill_nodes"] == 3
    assert results["scenario"]["sim"]["slo_tpot_s"] == 0.05
    assert all(r["summary"]["requests"] > 0 for r in results["results"])


def test_simulate_with_a_bad_manifest(tmp_path: Path) -> None:
    bad = tmp_path / "pool.yaml"
    bad.write_text(EXAMPLE.read_text().replace("tpot: 50ms", "tpot: fast"))
    proc = subprocess.run(
        [sys.executable, "-m", "agentpool.cli", "simulate", "-f", str(bad), "--out", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "spec.slo.tpot" in proc.stderr and "Traceback" not in proc.stderr
