"""Systems compared in worker processes give the results of running them one after the other."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agentpool.sim.cli import compare, default_jobs
from agentpool.sim.parallel import run_parallel
from agentpool.sim.run import Scenario
from agentpool.sim.simulator import SimConfig

SMALL = Scenario(
    conversations=10,
    agents=10,
    warmup_s=60.0,
    duration_s=240.0,
    max_pause_s=30.0,
    static_prefill_nodes=2,
    sim=SimConfig(nodes=4, prefill_nodes=2),
)
WALL = {"wall_s", "sim_requests_per_wall_s"}


def without_wall(results: list[dict[str, object]]) -> list[dict[str, object]]:
    return [{k: v for k, v in r.items() if k not in WALL} for r in results]


def test_parallel_results_equal_sequential_ones_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    names = ["static-cache-aware", "agentpool", "dynamo-like"]
    sequential = compare(SMALL, names, quiet=True, jobs=1)
    parallel = compare(SMALL, names, quiet=False, jobs=2)  # with the progress line drawn
    assert [r["system"] for r in parallel] == names
    assert all(r["requests_simulated"] > 0 for r in parallel)
    assert without_wall(parallel) == without_wall(sequential)
    line = capsys.readouterr().err
    assert "agentpool 100%" in line and "dynamo-like 100%" in line


def test_a_failing_run_raises_in_the_caller(tmp_path: Path) -> None:
    missing = tmp_path / "missing.jsonl"  # the workers load it: the error happens in them
    broken = dataclasses.replace(SMALL, trace=str(missing))
    with pytest.raises(FileNotFoundError, match=r"missing\.jsonl"):
        run_parallel(broken, ["agentpool", "static-cache-aware"], None, jobs=2)


def test_jobs_must_be_positive_and_default_to_one_per_system_and_core() -> None:
    with pytest.raises(ValueError, match="jobs must be at least 1"):
        run_parallel(SMALL, ["agentpool"], None, jobs=0)
    assert 1 <= default_jobs(["a", "b", "c"]) <= 3
    assert default_jobs(["a"]) == 1
