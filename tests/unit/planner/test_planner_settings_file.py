"""Planner settings: flags over file over defaults; a bad reload keeps the last good settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentpool.models import MoeShape, OccupancyCount
from agentpool.models.refit import RefitPolicy
from agentpool.planner.config import PlannerConfig
from agentpool.planner.process import parser, setting_flags
from agentpool.planner.settings_file import PlannerSettings, build_config


def test_flags_win_over_the_file_and_the_file_over_defaults(tmp_path: Path) -> None:
    path = tmp_path / "planner.yaml"
    path.write_text("window_s: 300\nslices: 5\noccupancy: in_decode\n")
    args = parser().parse_args(
        ["--namespace", "ns", "--pool", "p", "--router", "http://r", "--slices", "4", "--enabled", "false"]
    )
    settings = PlannerSettings(setting_flags(args), path)
    cfg = settings()
    assert (cfg.window_s, cfg.slices, cfg.enabled, cfg.warmup_s) == (300, 4, False, 1800)
    assert cfg.occupancy is OccupancyCount.IN_DECODE  # the string became the enum


async def test_reload_applies_changes_and_keeps_the_last_good_settings(tmp_path: Path) -> None:
    path = tmp_path / "planner.json"
    path.write_text('{"window_s": 300}')
    settings = PlannerSettings({}, path)
    path.write_text('{"window_s": 120, "cooldown_s": 30}')
    assert await settings.reload()
    assert (settings().window_s, settings().cooldown_s) == (120, 30)
    for bad in ('{"window_s": -1}', '{"windows": 60}', "[1, 2]", "{not: [yaml"):
        path.write_text(bad)
        assert not await settings.reload()
        assert settings().window_s == 120
    path.unlink()
    assert not await settings.reload()
    assert not await PlannerSettings({}).reload()


def test_bad_values_are_value_errors() -> None:
    with pytest.raises(ValueError, match="unknown"):
        build_config({"window": 1}, {})
    with pytest.raises(ValueError):
        build_config({"slices": "many"}, {})
    with pytest.raises(ValueError):
        PlannerConfig(occupancy="in_the_air")  # type: ignore[arg-type]


def test_refit_thresholds_from_the_command_line_and_the_file(tmp_path: Path) -> None:
    """The operator writes them into the settings file; flags win over it as for every setting."""
    path = tmp_path / "planner.json"
    path.write_text('{"refit_margin": 2.0, "refit_min_records": 50, "refit_max_error": 0.2}')
    common = ["--namespace", "ns", "--pool", "p", "--router", "http://r"]
    refit = ["--refit-min-records", "30", "--refit-min-share", "0.5", "--refit-max-records", "600"]
    args = parser().parse_args([*common, *refit, "--refit", "false"])
    cfg = PlannerSettings(setting_flags(args), path)()
    assert cfg.refit is False
    assert cfg.refit_policy() == RefitPolicy(
        margin=2.0, min_records=30, min_share=0.5, max_error=0.2, max_records=600
    )
    assert PlannerConfig().refit_policy() == RefitPolicy()  # the defaults are RefitPolicy's
    with pytest.raises(ValueError, match="max_records >= 2 x min_records"):
        build_config({"refit_min_records": 400, "refit_max_records": 600}, {})
    with pytest.raises(ValueError, match="margin must be >= 1"):
        build_config({"refit_margin": 0.5}, {})


@pytest.mark.parametrize(
    "bad",
    [
        {"c0": 0.01},  # not every coefficient
        {"c0": 0.01, "c1": 1e-5, "c2": 0, "c3": 0, "d0": 0.01, "d1": 0.005, "d2": 1e-4, "t_bar": 8192},
        {"c0": "fast", "c1": 1e-5, "c2": 0, "c3": 0, "d0": 0.01, "d1": 0.005, "d2": 1e-4},
        {"c0": True, "c1": 1e-5, "c2": 0, "c3": 0, "d0": 0.01, "d1": 0.005, "d2": 1e-4},
        {"c0": -0.01, "c1": 1e-5, "c2": 0, "c3": 0, "d0": 0.01, "d1": 0.005, "d2": 1e-4},
        "0.01",
    ],
)
def test_a_prior_model_from_the_file_is_seven_non_negative_numbers(bad: object) -> None:
    good = {"c0": 0.01, "c1": 1e-5, "c2": 0, "c3": 0, "d0": 0.01, "d1": 0.005, "d2": 1e-4}
    prior = build_config({"prior_model": good}, {}).prior_model
    assert prior is not None and prior.node_model(MoeShape(4, 16)).decode.experts_total == 16
    with pytest.raises(ValueError):
        build_config({"prior_model": bad}, {})


def test_a_json_settings_file_keeps_exponents_numbers(tmp_path: Path) -> None:
    """The operator and `agentpool up` write planner.json with `json.dumps`, which writes 4e-05: read
    as YAML 1.1 that is a string, and the planner refused to start (found running `agentpool up`)."""
    path = tmp_path / "planner.json"
    prior = {"c0": 0.012, "c1": 4e-05, "c2": 2e-10, "c3": 1e-07, "d0": 0.009, "d1": 0.004, "d2": 0.0002}
    path.write_text(json.dumps({"window_s": 300, "prior_model": prior}))
    assert "4e-05" in path.read_text()
    cfg = PlannerSettings({}, path)()
    assert cfg.prior_model is not None and cfg.prior_model.c1 == 4e-05
    yaml_path = tmp_path / "planner.yaml"  # a hand-written YAML file: the same value in YAML's spelling
    yaml_path.write_text(
        "prior_model: {c0: 0.012, c1: 4.0e-5, c2: 2.0e-10, c3: 1.0e-7, d0: 0.009, d1: 0.004, d2: 2.0e-4}\n"
    )
    assert PlannerSettings({}, yaml_path)().prior_model == cfg.prior_model
