"""Merging seed tables whose rows ran on different commits: the named rows of each part, per seed."""

from __future__ import annotations

from typing import Any

import pytest

from bench.sim_tables import Part, as_seed_payload, fit_error_table, merge_payloads, seed_table


def _run(system: str, rps: float) -> dict[str, Any]:
    summary = {
        "throughput_rps": rps,
        "ttft_s": {"p95": 1.0},
        "e2e_s": {"mean": 2.0},
        "lost_kv_reuse": 0.0,
        "final_split": [3, 6],
    }
    return {"system": system, "summary": summary}


def _payload(rps: dict[str, float], bound: float = 5.0) -> dict[str, Any]:
    by_seed = {str(s): [_run(name, x + s) for name, x in rps.items()] for s in (0, 1)}
    return {"sections": [{"agents": 126, "bounds": {"0": bound, "1": bound}, "results_by_seed": by_seed}]}


def test_merge_keeps_the_named_rows_of_each_part_in_order() -> None:
    old = _payload({"agentpool": 1.0, "static": 2.0, "arrow": 3.0})
    new = _payload({"agentpool": 1.5})
    parts = [Part.parse("new@abc=agentpool"), Part.parse("old@def=static, arrow")]
    merged = merge_payloads([(parts[0], new), (parts[1], old)])
    rows = merged["sections"][0]["results_by_seed"]["1"]
    assert [(r["system"], r["summary"]["throughput_rps"], r["commit"]) for r in rows] == [
        ("agentpool", 2.5, "abc"),
        ("static", 3.0, "def"),
        ("arrow", 4.0, "def"),
    ]
    table = seed_table(
        {int(s): rs for s, rs in merged["sections"][0]["results_by_seed"].items()}, {0: 5.0, 1: 5.0}
    )
    assert "| agentpool | 2.000 (1.500-2.500) | 40% |" in table


def test_merge_refuses_different_bounds_a_missing_row_and_a_row_kept_twice() -> None:
    a, b = _payload({"agentpool": 1.0}), _payload({"static": 2.0}, bound=6.0)
    with pytest.raises(ValueError, match="bound"):
        merge_payloads([(Part.parse("a@1=agentpool"), a), (Part.parse("b@2=static"), b)])
    with pytest.raises(ValueError, match="no static"):
        merge_payloads([(Part.parse("a@1=static"), a)])
    with pytest.raises(ValueError, match="twice"):
        merge_payloads([(Part.parse("a@1=agentpool"), a), (Part.parse("a@1=agentpool"), a)])
    with pytest.raises(ValueError, match="expected"):
        Part.parse("a=agentpool")


def test_fit_error_table_gives_the_errors_over_seeds_and_each_seeds_refits() -> None:
    err = {"prefill_mean": 0.04, "prefill_mean_worst_node": 0.05, "prefill_max": 0.2}
    err |= {"decode_mean": 0.07, "decode_mean_worst_node": 0.09, "decode_max": 0.3}
    fitted = [_run("agentpool", 1.0) | {"planner_log": [{"outcome": "fit"}]} for _ in range(2)]
    fitted[0]["summary"] = fitted[0]["summary"] | {"fit_error": err}
    fitted[1]["summary"] = fitted[1]["summary"] | {"fit_error": err | {"prefill_mean": 0.02}}
    fitted[1]["planner_log"] += [{"outcome": "refit"}, {"outcome": "refit"}]
    by_seed = {0: [_run("preset", 1.0), fitted[0]], 1: [_run("preset", 1.0), fitted[1]]}
    table = fit_error_table(by_seed)
    assert "| agentpool | 3.0% (2.0%-4.0%) | 5.0% / 20.0% | 7.0% (7.0%-7.0%) | 9.0% / 30.0% | 0 2 |" in table
    assert "| preset | - | - | - | - | 0 0 |" in table
    assert "preset" not in fit_error_table(by_seed, fitted_only=True)


def test_one_run_sections_merge_under_their_seed() -> None:
    scenario = {"agents": 2560, "seed": 0}

    def sections(name: str, rps: float) -> dict[str, Any]:
        return {"sections": [{"heading": name, "scenario": scenario, "results": [_run(name, rps)]}]}

    a, b = as_seed_payload(sections("agentpool", 31.0)), as_seed_payload(sections("static", 12.0))
    merged = merge_payloads([(Part.parse("a@1=agentpool"), a), (Part.parse("b@2=static"), b)])
    rows = merged["sections"][0]["results_by_seed"]["0"]
    assert [(r["system"], r["commit"]) for r in rows] == [("agentpool", "1"), ("static", "2")]


def test_a_seed_table_without_bounds_says_so() -> None:
    """An open loop's sections carry no bounds (merged payloads keep an empty map)."""
    by_seed = {s: [_run("agentpool", 1.0 + s)] for s in (0, 1)}
    table = seed_table(by_seed, {})
    assert "| agentpool | 1.500 (1.000-2.000) | - |" in table and "no bound" in table
