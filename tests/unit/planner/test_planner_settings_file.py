"""Planner settings: flags over file over defaults; a bad reload keeps the last good settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentpool.models import OccupancyCount
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
