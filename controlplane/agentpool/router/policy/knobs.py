"""Knob parsing for policies: each policy declares a frozen dataclass of float knobs with defaults."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from agentpool.router.policy.contract import PolicyError

K = TypeVar("K")


def parse_knobs(policy: str, cls: type[K], knobs: Mapping[str, float] | None) -> K:
    """Build ``cls`` from ``knobs``: unknown names and non-numbers are errors, missing ones default."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    names = {f.name for f in dataclasses.fields(cls)}
    given = dict(knobs or {})
    unknown = sorted(set(given) - names)
    if unknown:
        raise PolicyError(f"policy {policy!r}: unknown knobs {unknown}; known: {sorted(names)}")
    values: dict[str, Any] = {}
    for name, value in given.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise PolicyError(f"policy {policy!r}: knob {name!r} must be a number, got {value!r}")
        values[name] = value
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        raise PolicyError(f"policy {policy!r}: {e}") from e
