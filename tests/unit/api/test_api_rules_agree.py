"""Generated manifests: the pydantic predicates and the CEL rules must agree on every one of them."""

from __future__ import annotations

import copy
import datetime
from typing import Any

import celpy
from asp_validators import crd_errors, go_duration, pydantic_errors
from hypothesis import given, settings
from hypothesis import strategies as st

from agentpool.api import byte_quantity, duration_seconds
from agentpool.api.values import duration_nanoseconds

BASE: dict[str, Any] = {
    "apiVersion": "agentpool.io/v1alpha1",
    "kind": "AgentServingPool",
    "metadata": {"name": "p"},
    "spec": {
        "model": {"name": "m"},
        "engine": {"backend": "sim", "image": "img", "hostKvSize": "1Gi"},
        "nodes": 2,
        "slo": {"ttft": {"base": "2s"}, "tpot": "50ms"},
    },
}


def _messages_from_crd(errors: list[str]) -> set[str]:
    return {err.split("Invalid value: ", 1)[1] for err in errors if "Invalid value: " in err}


def _messages_from_pydantic(errors: list[str]) -> set[str]:
    out: set[str] = set()
    for err in errors:
        if "Value error, " in err:
            out.update(err.split("Value error, ", 1)[1].split("; "))
    return out


@settings(max_examples=150, deadline=None)
@given(
    mode=st.sampled_from(["disaggregated", "colocated"]),
    nodes=st.integers(1, 10),
    prefill=st.none() | st.integers(0, 11),
    min_prefill=st.integers(1, 4),
    min_decode=st.integers(1, 4),
    enabled=st.booleans(),
)
def test_split_rules_agree(
    mode: str, nodes: int, prefill: int | None, min_prefill: int, min_decode: int, enabled: bool
) -> None:
    manifest = copy.deepcopy(BASE)
    spec = manifest["spec"]
    spec.update(mode=mode, nodes=nodes)
    spec["planner"] = {"enabled": enabled, "minNodes": {"prefill": min_prefill, "decode": min_decode}}
    if prefill is not None:
        spec["initialSplit"] = {"prefill": prefill}
    assert _messages_from_pydantic(pydantic_errors(manifest)) == _messages_from_crd(crd_errors(manifest))


DURATION_TEXT = st.text(alphabet="0123456789.hmsu -", max_size=9) | st.sampled_from(
    ["10m", "1h30m", "0.45ms", "250ms", "0s", "1m1m", "2h0m0.5s", ".5s", "5", "1.s", "10M", "1d"]
)


@settings(max_examples=200, deadline=None)
@given(text=DURATION_TEXT)
def test_durations_agree(text: str) -> None:
    manifest = copy.deepcopy(BASE)
    manifest["spec"]["slo"]["tpot"] = text
    manifest["spec"]["planner"] = {"cooldown": text}
    py, kube = pydantic_errors(manifest), crd_errors(manifest)
    assert bool(py) == bool(kube), (py, kube)


@settings(max_examples=100, deadline=None)
@given(
    parts=st.lists(
        st.tuples(
            st.integers(0, 5000), st.sampled_from(["", ".5", ".25"]), st.sampled_from(["h", "m", "s", "ms"])
        ),
        min_size=1,
        max_size=3,
    )
)
def test_duration_seconds_equal_cel_duration(parts: list[tuple[int, str, str]]) -> None:
    text = "".join(f"{n}{frac}{unit}" for n, frac, unit in parts)
    env = celpy.Environment()
    cel_value = env.program(env.compile("duration(self)")).evaluate({"self": celpy.celtypes.StringType(text)})
    assert isinstance(cel_value, datetime.timedelta)
    assert abs(duration_seconds(text) - cel_value.total_seconds()) < 1e-6


@settings(max_examples=150, deadline=None)
@given(
    value=st.text(alphabet="0123456789.KMGTiEkm-", max_size=6)
    | st.integers(-5, 2**40)
    | st.sampled_from(["64Gi", "1.5Ti", "500M", "0", "1k", "1K", "1Gb", "1e3", "Gi"])
)
def test_host_kv_sizes_agree(value: int | str) -> None:
    manifest = copy.deepcopy(BASE)
    manifest["spec"]["engine"]["hostKvSize"] = value
    py, kube = pydantic_errors(manifest), crd_errors(manifest)
    assert bool(py) == bool(kube), (py, kube)
    if not py:
        assert byte_quantity(value) >= 0


@settings(max_examples=200, deadline=None)
@given(
    parts=st.lists(
        st.tuples(
            st.integers(0, 10**7),
            st.sampled_from(["", ".5", ".0004", ".0000001", ".123456789"]),
            st.sampled_from(["h", "m", "s", "ms"]),
        ),
        min_size=1,
        max_size=3,
    )
)
def test_duration_nanoseconds_equal_go_parse(parts: list[tuple[int, str, str]]) -> None:
    """The spec's nanoseconds and the test's Go-semantics `duration()` (written apart) agree."""
    text = "".join(f"{n}{frac}{unit}" for n, frac, unit in parts)
    try:
        expected: int | None = int(go_duration(text))
    except celpy.CELEvalError:
        expected = None
    try:
        got: int | None = duration_nanoseconds(text)
    except ValueError:
        got = None
    assert got == expected


@settings(max_examples=100, deadline=None)
@given(
    min_records=st.none() | st.integers(1, 3000),
    max_records=st.none() | st.integers(2, 8000),
)
def test_refit_record_rules_agree(min_records: int | None, max_records: int | None) -> None:
    """Either count may be left to its default (20, 4000): the CEL rule spells the defaults out."""
    manifest = copy.deepcopy(BASE)
    refit = {"minRecords": min_records, "maxRecords": max_records}
    manifest["spec"]["planner"] = {"refit": {k: v for k, v in refit.items() if v is not None}}
    manifest["spec"]["initialSplit"] = {"prefill": 1}
    assert _messages_from_pydantic(pydantic_errors(manifest)) == _messages_from_crd(crd_errors(manifest))
