"""`agentpool simulate` end to end: the command line, the bundled trace, every report file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from agentpool.sim import cli as sim_cli


def main(argv: list[str]) -> int:
    """``agentpool simulate ARGS`` as ``agentpool.cli`` dispatches it (parser + run of the subcommand)."""
    parser = argparse.ArgumentParser(prog="agentpool")
    sub = parser.add_subparsers(dest="command", required=True)
    sim_cli.add_arguments(sub.add_parser("simulate"))
    return sim_cli.run(parser.parse_args(argv))


def test_simulate_writes_json_markdown_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    rc = main(
        [
            "simulate",
            "--systems",
            "agentpool,static-cache-aware",
            "--conversations",
            "12",
            "--agents",
            "12",
            "--warmup",
            "60",
            "--duration",
            "300",
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert rc == 0
    data = json.loads((out / "results.json").read_text())
    assert [r["system"] for r in data["results"]] == ["agentpool", "static-cache-aware"]
    for r in data["results"]:
        assert r["summary"]["requests"] > 0
        assert 0.0 <= r["summary"]["lost_kv_reuse"] <= 1.0
    md = (out / "report.md").read_text()
    assert "| agentpool |" in md and "| static-cache-aware |" in md
    for png in ("split_over_time.png", "ttft_cdf.png", "throughput.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "agentpool" in capsys.readouterr().out


def test_simulate_rejects_unknown_systems(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="unknown systems"):
        main(["simulate", "--systems", "vllm", "--out", str(tmp_path)])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workload", "mooncake"], "mooncake workload needs --trace"),
        (["--block-tokens", "100"], "multiple of the trace's 64 tokens, got 100"),
        (["--block-tokens", "0"], "positive multiple of the trace's 64 tokens, got 0"),
        (["--jobs", "0"], "--jobs must be at least 1"),
    ],
)
def test_simulate_rejects_bad_settings_before_running(tmp_path: Path, args: list[str], message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        main(["simulate", *args, "--quiet", "--out", str(tmp_path)])


def test_simulate_says_what_it_does_and_draws_no_progress_off_a_terminal(tmp_path: Path) -> None:
    """Run as a user would, output to a pipe: step lines from the start, no redrawn progress, a
    narrow table, the bound."""
    import os
    import subprocess
    import sys

    out = tmp_path / "out"
    args = ["--systems", "agentpool,static-cache-aware", "--conversations", "8", "--agents", "8"]
    args += ["--warmup", "30", "--duration", "120", "--no-plots", "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "agentpool.cli", "simulate", *args],
        capture_output=True,
        text=True,
        env=os.environ,
        timeout=300,
        check=True,
    )
    assert proc.stderr.startswith("agentpool simulate: loading the Claude Code trace")
    assert "simulating 2 runs" in proc.stderr and "\r" not in proc.stderr
    table = [line for line in proc.stdout.splitlines() if line.startswith("|")]
    assert table and max(len(line) for line in table) <= 110
    assert "Upper bound of each run" in proc.stdout
    data = json.loads((out / "results.json").read_text())
    assert data["bound"]["ideal_window_rps"] > 0
    for r in data["results"]:
        assert 0 < r["summary"]["throughput_rps"] <= r["summary"]["bound_rps"], r["system"]


def test_no_refit_keeps_the_online_fit_frozen() -> None:
    parser = argparse.ArgumentParser()
    sim_cli.add_arguments(parser)
    assert sim_cli.scenario_from(parser.parse_args([])).planner.refit  # the live planner's default
    assert not sim_cli.scenario_from(parser.parse_args(["--no-refit"])).planner.refit
