"""The planner's configuration from flags and an optional file that is re-read while it runs.

The file (YAML or JSON) holds :class:`agentpool.planner.config.PlannerConfig` fields by name
(``window_s``, ``slices``, ``warmup_s``, ``cooldown_s``, ``min_prefill``, ``min_decode``,
``initial_prefill``, ``enabled``, ``occupancy``, ``refit``, ``min_relative_gain`` and the refit
thresholds ``refit_margin``, ``refit_min_records``, ``refit_min_share``, ``refit_max_error``,
``refit_max_records``), and optionally ``generation``: the pool generation the operator rendered
the file for, which the planner reports as the one it runs (:attr:`PlannerSettings.generation`);
unknown keys are an error. Flags given on the
command line win over the file, the file over the defaults. The file is re-read every
``reload_s`` in a worker thread (no blocking I/O on the event loop); a change applies at the
next window. A file that stops parsing or validating is logged and the last good configuration
stays in force.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from agentpool.planner.config import PlannerConfig

log = logging.getLogger(__name__)

FIELDS = frozenset(f.name for f in dataclasses.fields(PlannerConfig))
GENERATION_KEY = "generation"


def split_generation(values: Mapping[str, Any]) -> tuple[dict[str, Any], int | None]:
    """The file's settings without ``generation``, and the generation (None when absent)."""
    rest = dict(values)
    generation = rest.pop(GENERATION_KEY, None)
    if generation is not None and (
        isinstance(generation, bool) or not isinstance(generation, int) or generation < 0
    ):
        raise ValueError(f"planner settings: generation must be a non-negative integer, got {generation!r}")
    return rest, generation


def build_config(file_values: Mapping[str, Any], flags: Mapping[str, Any]) -> PlannerConfig:
    """Defaults, then the file's values, then the flags; ValueError for unknown or bad values."""
    unknown = sorted(set(file_values) - FIELDS)
    if unknown:
        raise ValueError(f"unknown planner settings {unknown}; known: {sorted(FIELDS)}")
    try:
        return PlannerConfig(**{**file_values, **flags})
    except TypeError as e:  # a value of the wrong type the dataclass could not compare
        raise ValueError(str(e)) from e


def read_file(path: Path) -> dict[str, Any]:
    """The mapping in ``path``: JSON for a ``.json`` file (the operator's and ``agentpool up``'s),
    else YAML (whose 1.1 reader would take JSON's ``4e-05`` for a string); ValueError if it is not
    one."""
    try:
        text = path.read_text()
        raw = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise ValueError(f"cannot read planner settings {path}: {e}") from e
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"planner settings {path} must be a mapping, got {type(raw).__name__}")
    return {str(k): v for k, v in raw.items()}


class PlannerSettings:
    """Callable that returns the current :class:`PlannerConfig` (what the controller reads)."""

    def __init__(self, flags: Mapping[str, Any], path: Path | None = None, reload_s: float = 5.0):
        self._flags = dict(flags)
        self.path = path
        self.reload_s = reload_s
        self._text: str | None = None
        values, self.generation = split_generation(read_file(path) if path is not None else {})
        self._config = build_config(values, self._flags)

    def __call__(self) -> PlannerConfig:
        return self._config

    async def reload(self) -> bool:
        """Re-read the file; True when the configuration changed."""
        if self.path is None:
            return False
        try:
            values, generation = split_generation(await asyncio.to_thread(read_file, self.path))
            config = build_config(values, self._flags)
        except ValueError as e:
            log.error("planner settings not applied, keeping the last good ones: %s", e)
            return False
        self.generation = generation  # the file is in force, whether or not a value changed
        if config == self._config:
            return False
        log.info("planner settings changed: %s", config)
        self._config = config
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Reload every ``reload_s`` until ``stop``."""
        if self.path is None:
            return
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.reload_s)
            if not stop.is_set():
                await self.reload()
