"""``bench_sim scale --seeds`` and ``open-loop --min-relative-gain``: the options reach the runs."""

from __future__ import annotations

import argparse
import re

import pytest

from agentpool.sim.planners import PlannerSettings
from bench import bench_sim, sim_scale


def test_scale_over_seeds_runs_each_seed_and_tables_the_spread(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "scale", "--scale-nodes", "4", "--warmup", "60", "--duration", "60", "--ramp", "30",
        "--seeds", "0", "1", "--scale-systems", "static-cache-aware", "--jobs", "1",
    ]  # fmt: skip
    assert bench_sim.main(argv) == 0
    out = capsys.readouterr().out
    assert "seed 0 static-cache-aware: simulated 1 of 2 min" in out
    assert "seed 1 static-cache-aware: simulated 1 of 2 min" in out
    rows = re.findall(r"^\| static-cache-aware \| ([\d.]+) \|", out, re.M)
    assert len(rows) == 2 and rows[0] != rows[1]  # one row per seed; the seed changes the result
    spread = re.search(r"^\| static-cache-aware \| ([\d.]+) \(([\d.]+)-([\d.]+)\) \|", out, re.M)
    assert spread is not None
    assert sorted(rows) == [spread.group(2), spread.group(3)]


def test_open_loop_scenario_takes_the_gain_floor() -> None:
    args = argparse.Namespace(trace=None, warmup=60.0, duration=60.0, max_pause=None, min_relative_gain=0.07)
    sc = bench_sim._open_loop_scenario(args, 2.0, seed=1)
    assert sc.planner.min_relative_gain == 0.07 and sc.seed == 1
    args.min_relative_gain = None
    assert bench_sim._open_loop_scenario(args, 2.0, seed=1).planner == PlannerSettings()


@pytest.mark.parametrize(("block_tokens", "blocks"), [(512, 512), (1024, 1024)])
def test_scale_scenario_takes_the_block_size(block_tokens: int, blocks: int) -> None:
    args = argparse.Namespace(
        scale_nodes=4, trace=None, warmup=60.0, duration=60.0, ramp=30.0, min_relative_gain=None,
        block_tokens=block_tokens,
    )  # fmt: skip
    sc = sim_scale._scale_scenario(args, seed=2)
    assert sc.sim.block_size == blocks and sc.sim.nodes == 4 and sc.seed == 2


def test_scale_scenario_refuses_a_block_size_off_the_traces_blocks() -> None:
    args = argparse.Namespace(
        scale_nodes=4, trace=None, warmup=60.0, duration=60.0, ramp=30.0, min_relative_gain=None,
        block_tokens=1000,
    )  # fmt: skip
    with pytest.raises(ValueError, match="1000"):
        sim_scale._scale_scenario(args)


@pytest.mark.parametrize("value", ["1000", "0", "-512"])
def test_bench_sim_refuses_a_block_size_off_the_traces_blocks_in_one_line(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        bench_sim.main(["scale", "--block-tokens", value])
    assert e.value.code == 2
    assert (
        f"--block-tokens must be a positive multiple of the trace's 64 tokens, got {value}"
        in capsys.readouterr().err
    )
