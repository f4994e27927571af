"""Tables and result files of the simulator benchmarks (``bench_sim``): mean and spread over seeds per
system, the colocated sweep's curve, the loop that runs one comparison once per seed, the writers
of ``bench/results/sim_*.md`` and their JSON, and the merge of tables over seeds whose rows were run
on different commits:

    python -m bench.sim_tables merge cc_paper_load_seeds \
        --part cc_paper_load_seeds_baselines@877c5c0=static-cache-aware,dynamo-like \
        --part cc_paper_load_seeds@9e585d1=arrow-like,oracle-reference

writes ``sim_cc_paper_load_seeds.md`` and its JSON from the named rows of each part's JSON (all parts
are read before anything is written, so a part may be the output itself).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentpool.sim.cli import compare
from agentpool.sim.planners import PlannerSettings
from agentpool.sim.report import markdown_table
from agentpool.sim.run import (
    Scenario,
    best_reference,
    load_conversations,
    reference_runs,
    scenario_bound,
    scenario_dict,
)
from agentpool.sim.simulator import SimConfig

RESULTS = Path(__file__).resolve().parent / "results"

BySeed = dict[int, list[dict[str, Any]]]  # seed -> the comparison's results
Bounds = dict[int, float | None]  # seed -> the analytic closed-loop bound (req/s), where one applies


def over_seeds(
    scenario: Callable[[int], Scenario], systems: Sequence[str], seeds: Sequence[int], jobs: int, label: str
) -> tuple[BySeed, Bounds]:
    """Run ``systems`` on ``scenario(seed)`` for every seed; the static reference's sweep folded into
    its best split; the bound of each seed's scenario (None where none applies)."""
    by_seed: BySeed = {}
    bounds: Bounds = {}
    for seed in seeds:
        sc = scenario(seed)
        convs = load_conversations(sc)
        runs = compare(
            sc, reference_runs(list(systems), sc.sim.nodes), quiet=True, jobs=jobs, conversations=convs
        )
        by_seed[seed] = best_reference(runs)
        b = scenario_bound(sc, convs)
        bounds[seed] = None if b is None else b.reference_rps
        print(f"{label}, seed {seed}: done", flush=True)
    return by_seed, bounds


def slim(by_seed: BySeed) -> dict[str, list[dict[str, Any]]]:
    """``by_seed`` for JSON: keys as strings, without the per-request TTFT samples."""
    return {
        str(s): [{k: v for k, v in r.items() if k != "ttft_samples"} for r in rs] for s, rs in by_seed.items()
    }


def seed_table(by_seed: dict[int, list[dict[str, Any]]], bounds: dict[int, float | None]) -> str:
    """Mean and spread (min-max) over seeds of each system's key figures, and the bound."""
    seeds = sorted(by_seed)
    names = [r["system"] for r in by_seed[seeds[0]]]
    head = (
        "| system | req/s mean (min-max) | of bound | TTFT p95 s | E2E mean s | lost reuse | final splits |"
    )
    lines = [head, "|---|---|---|---|---|---|---|"]

    def vals(name: str, get: Any) -> list[float]:
        return [float(get(next(r for r in by_seed[s] if r["system"] == name)["summary"])) for s in seeds]

    def run_bounds(name: str) -> list[float | None]:
        """Each run's own bound (``bound_rps``); tables run before it existed: the seed's figure."""
        runs = [next(r for r in by_seed[s] if r["system"] == name)["summary"] for s in seeds]
        return [r.get("bound_rps", bounds.get(s)) for r, s in zip(runs, seeds, strict=True)]

    for name in names:
        x = vals(name, lambda m: m["throughput_rps"])
        share = [v / b for v, b in zip(x, run_bounds(name), strict=True) if b]
        p95 = vals(name, lambda m: m["ttft_s"]["p95"])
        e2e = vals(name, lambda m: m["e2e_s"]["mean"])
        lost = vals(name, lambda m: m["lost_kv_reuse"])
        splits = []
        for s in seeds:
            sp = next(r for r in by_seed[s] if r["system"] == name)["summary"]["final_split"]
            splits.append(f"{sp[0]}P{sp[1]}D" if sp else "-")
        lines.append(
            f"| {name} | {sum(x) / len(x):.3f} ({min(x):.3f}-{max(x):.3f}) | "
            + (f"{sum(share) / len(share):.0%}" if share else "-")
            + f" | {sum(p95) / len(p95):.1f} ({min(p95):.1f}-{max(p95):.1f}) | {sum(e2e) / len(e2e):.2f} | "
            f"{sum(lost) / len(lost):.2%} | {' '.join(splits)} |"
        )
    known = [b for b in bounds.values() if b]
    per_run = any("bound_rps" in r["summary"] for rs in by_seed.values() for r in rs)
    if not known:
        bound = "no bound"
    elif per_run:
        bound = (
            f"of bound: of each run's own bound (`agentpool.sim.bounds`); the ideal replay's rate "
            f"{sum(known) / len(known):.3f} req/s (mean over seeds) is a reference"
        )
    else:
        bound = f"bound {sum(known) / len(known):.3f} req/s (mean over seeds)"
    return "\n".join(lines) + f"\n\nSeeds {', '.join(map(str, seeds))}; {bound}.\n"


def fit_error_table(by_seed: BySeed, fitted_only: bool = False) -> str:
    """The fitted models' errors against the ground truth (``summary["fit_error"]``, the first fit of a
    run that fitted): prefill and decode, the mean over nodes (mean and min-max over seeds), the worst
    node's mean and the worst grid point (max over seeds); and how many refits each seed's run made
    (``refit`` entries of its planner log). ``fitted_only`` leaves out the systems that never fitted."""
    seeds = sorted(by_seed)
    lines = [
        "| system | prefill error | prefill worst node / point | decode error | decode worst node / point "
        "| refits per seed |",
        "|---|---|---|---|---|---|",
    ]
    for name in [r["system"] for r in by_seed[seeds[0]]]:
        runs = [next(r for r in by_seed[s] if r["system"] == name) for s in seeds]
        errs = [r["summary"].get("fit_error") for r in runs]
        refits = " ".join(str(sum(e["outcome"] == "refit" for e in r.get("planner_log", []))) for r in runs)
        if not all(errs):
            if not fitted_only:
                lines.append(f"| {name} | - | - | - | - | {refits} |")
            continue
        cells = []
        for phase in ("prefill", "decode"):
            means = [100 * e[f"{phase}_mean"] for e in errs if e]
            worst_node = max(100 * e[f"{phase}_mean_worst_node"] for e in errs if e)
            worst_point = max(100 * e[f"{phase}_max"] for e in errs if e)
            cells += [_mean_range(means, "{:.1f}%"), f"{worst_node:.1f}% / {worst_point:.1f}%"]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {refits} |")
    return "\n".join(lines) + "\n"


def _mean_range(xs: list[float], fmt: str) -> str:
    return f"{fmt.format(sum(xs) / len(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


Runs = dict[tuple[str, int, int], dict[str, Any]]  # (system, agents, seed) -> run


def sweep_table(runs: Runs, systems: list[str], levels: list[int]) -> str:
    """Per policy and load level: TPS within SLO (mean and min-max over seeds), its peak level, and
    at each level the lost KV reuse and mean TPOT (means over seeds)."""
    seeds = sorted({k[2] for k in runs})

    def vals(name: str, level: int, get: Any) -> list[float]:
        return [float(get(runs[(name, level, s)]["summary"])) for s in seeds]

    head = "| policy | " + " | ".join(f"{a} agents" for a in levels) + " | peak |"
    lines = [head, "|---|" + "---|" * (len(levels) + 1)]
    for name in systems:
        tps = {a: vals(name, a, lambda m: m["tps_within_slo"]) for a in levels}
        peak = max(levels, key=lambda a: sum(tps[a]))
        cells = [_mean_range(tps[a], "{:.0f}") for a in levels]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {peak} agents |")
    lines += ["", "Lost KV reuse / mean TPOT ms / SLO attainment at each level (means over seeds):", ""]
    lines += [head.replace(" peak |", ""), "|---|" + "---|" * len(levels)]
    for name in systems:
        cells = []
        for a in levels:
            lost = vals(name, a, lambda m: m["lost_kv_reuse"])
            tpot = vals(name, a, lambda m: m["tpot_s"]["mean"])
            att = vals(name, a, lambda m: m["slo_attainment"])
            n = len(seeds)
            cells.append(f"{sum(lost) / n:.1%} / {1000 * sum(tpot) / n:.0f} / {sum(att) / n:.0%}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + f"\n\nSeeds {', '.join(map(str, seeds))}.\n"


def code_commit() -> str:
    """The commit of the code that ran (the checkout holding this file), ``+changes`` if the simulator
    or the benchmarks differ from it; ``unknown`` outside a git checkout."""
    root = RESULTS.parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "unknown"
    changed = git("status", "--porcelain", "--untracked-files=no", "--", "controlplane", "bench/*.py")
    return commit + ("+changes" if changed else "")


def write_seeds(name: str, md: list[str], payload: dict[str, Any]) -> None:
    """Store a table over seeds (Markdown and JSON) under ``bench/results/sim_NAME``; unless ``payload``
    names its commit, the code's commit goes after the command line (``md[1]``)."""
    if "commit" not in payload:
        payload["commit"] = code_commit()
        md = [*md[:2], f"Code: commit {payload['commit']}.\n", *md[2:]]
    (RESULTS / f"sim_{name}.md").write_text("\n".join(md), encoding="utf-8")
    (RESULTS / f"sim_{name}.json").write_text(json.dumps(payload, indent=1, default=float), encoding="utf-8")
    print(f"wrote {RESULTS / f'sim_{name}.md'}")


def command_line(module: str = "bench.bench_sim") -> str:
    return f"python -m {module} " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def write_sections(
    name: str, title: str, sections: list[tuple[str, Scenario, list[dict[str, Any]]]], notes: str
) -> None:
    command = command_line()
    commit = code_commit()
    md = [f"# {title}\n", f"Command: `{command}`\n", f"Code: commit {commit}.\n", notes + "\n"]
    payload: dict[str, Any] = {"command": command, "commit": commit, "sections": []}
    for heading, sc, results in sections:
        md.append(f"## {heading}\n")
        md.append(markdown_table(results))
        slim = [{k: v for k, v in r.items() if k != "ttft_samples"} for r in results]
        payload["sections"].append({"heading": heading, "scenario": scenario_dict(sc), "results": slim})
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"sim_{name}.md").write_text("\n".join(md), encoding="utf-8")
    (RESULTS / f"sim_{name}.json").write_text(json.dumps(payload, indent=1, default=float), encoding="utf-8")
    print(f"wrote {RESULTS / f'sim_{name}.md'}")


def print_results(heading: str, results: list[dict[str, Any]]) -> None:
    print(f"\n## {heading}\n{markdown_table(results)}", flush=True)


@dataclass(frozen=True, slots=True)
class Part:
    """Rows of one seed table's JSON (``sim_NAME.json``) kept in a merge, and the commit they ran on."""

    name: str
    commit: str
    systems: tuple[str, ...]

    @classmethod
    def parse(cls, spec: str) -> Part:
        """``NAME@COMMIT=SYSTEM,SYSTEM``."""
        head, eq, systems = spec.partition("=")
        name, at, commit = head.partition("@")
        if not (eq and at and name and commit and systems):
            raise ValueError(f"expected NAME@COMMIT=SYSTEM[,SYSTEM...], got {spec!r}")
        return cls(name, commit, tuple(x.strip() for x in systems.split(",") if x.strip()))


def _section_key(section: dict[str, Any]) -> str:
    """What identifies a section across files: every key but the results and the bounds."""
    return json.dumps(
        {k: v for k, v in section.items() if k not in ("results_by_seed", "bounds")}, sort_keys=True
    )


def as_seed_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """A ``write_sections`` payload (one run per section, under ``results``) as a seed table's: its runs
    under their scenario's seed, no bound, the heading left out (parts name their sections apiece)."""
    sections = []
    for section in payload["sections"]:
        if "results" not in section:
            sections.append(section)
            continue
        kept = {k: v for k, v in section.items() if k not in ("results", "heading")}
        by_seed = {str(section["scenario"]["seed"]): section["results"]}
        sections.append({**kept, "bounds": {}, "results_by_seed": by_seed})
    return {**payload, "sections": sections}


def merge_payloads(parts: Sequence[tuple[Part, dict[str, Any]]]) -> dict[str, Any]:
    """One seed table's payload from several: per section (matched on its keys, e.g. ``agents``), each
    part's systems for every seed, in the parts' order. Every part must have every section and seed
    of the first, and the same bound where both have one; a system kept twice is an error."""
    first = parts[0][1]["sections"]
    merged: list[dict[str, Any]] = []
    for section in first:
        key = _section_key(section)
        seeds = list(section["results_by_seed"])
        rows: dict[str, list[dict[str, Any]]] = {s: [] for s in seeds}
        bounds: dict[str, float | None] = dict(section.get("bounds", {}))
        for part, payload in parts:
            match = [x for x in payload["sections"] if _section_key(x) == key]
            if len(match) != 1:
                raise ValueError(f"{part.name}: {len(match)} sections match {key}")
            other = match[0]
            for seed in seeds:
                if seed not in other["results_by_seed"]:
                    raise ValueError(f"{part.name}: no seed {seed} in {key}")
                b, known = other.get("bounds", {}).get(seed), bounds.get(seed)
                if b is not None and known is not None and abs(b - known) > 1e-9:
                    raise ValueError(f"{part.name}: bound {b} differs from {known} (seed {seed})")
                by_name = {r["system"]: r for r in other["results_by_seed"][seed]}
                for name in part.systems:
                    if name not in by_name:
                        raise ValueError(f"{part.name}: no {name} in seed {seed} of {key}")
                    if any(r["system"] == name for r in rows[seed]):
                        raise ValueError(f"{name} kept twice (seed {seed})")
                    rows[seed].append(
                        {**by_name[name], "commit": part.commit, "source": f"sim_{part.name}.json"}
                    )
        merged.append({**section, "bounds": bounds, "results_by_seed": rows})
    return {"sections": merged}


def merged_markdown(
    title: str, header: str, payload: dict[str, Any], parts: Sequence[Part], commands: Sequence[str]
) -> list[str]:
    """The merged table's Markdown: title, where each row comes from (file, commit, the command that ran
    it), the setting, one table per section."""
    md = [
        f"# {title}\n",
        f"Merged by `{command_line('bench.sim_tables')}` from:\n",
        *[
            f"- {', '.join(p.systems)}: `sim_{p.name}.json`, commit {p.commit}, run by `{c}`"
            for p, c in zip(parts, commands, strict=True)
        ],
        "",
        header,
    ]
    for section in payload["sections"]:
        by_seed = {int(s): rs for s, rs in section["results_by_seed"].items()}
        bounds = {int(s): b for s, b in section["bounds"].items()}
        agents = section["scenario"]["agents"] if "scenario" in section else section.get("agents")
        rate = section.get("rate_per_min")
        heading = section.get("heading") or (
            f"{agents:,} concurrent agents" if agents else f"{rate} agents per minute" if rate else "results"
        )
        if len(by_seed) == 1:  # one seed: every column of the report
            ((seed, rows),) = by_seed.items()
            md.append(f"## {heading}, seed {seed}\n\n{markdown_table(rows)}")
        else:
            md.append(f"## {heading}\n\n{seed_table(by_seed, bounds)}")
        if any(r["summary"].get("fit_error") for rs in by_seed.values() for r in rs):
            md.append(
                "The online fit at the end of the first planner window against the ground truth (the "
                "noiseless truth on `agentpool.sim.fiterror`'s grid; mean over nodes, mean and min-max over "
                "seeds; the errors of later refits are in the planner log of the JSON):\n"
            )
            md.append(fit_error_table(by_seed, fitted_only=True))
    return md


def _md_header(name: str) -> tuple[str, str]:
    """A seed table's title and its setting paragraph (the text between the command and the tables)."""
    lines = (RESULTS / f"sim_{name}.md").read_text(encoding="utf-8").splitlines()
    title = lines[0].removeprefix("# ").strip()
    body: list[str] = []
    for line in lines[1:]:
        if line.startswith("## "):
            break
        if line.startswith(("Command", "Code: commit", "Merged by", "- ")) or not line.strip():
            continue
        body.append(line)
    return title, "\n".join(body) + "\n"


def merge(out: str, parts: Sequence[Part], header_from: str | None = None) -> None:
    """Write ``sim_OUT.md`` and its JSON from ``parts`` (read in full before anything is written); the
    title and setting paragraph of ``sim_HEADER_FROM.md``, else of the existing ``sim_OUT.md``, else
    of the first part's."""
    loaded = [
        (p, as_seed_payload(json.loads((RESULTS / f"sim_{p.name}.json").read_text(encoding="utf-8"))))
        for p in parts
    ]
    title, header = _md_header(
        header_from or (out if (RESULTS / f"sim_{out}.md").exists() else parts[0].name)
    )
    payload = merge_payloads(loaded)
    commands = [_run_command(pl, p.systems) for p, pl in loaded]
    md = merged_markdown(title, header, payload, parts, commands)
    payload["command"] = md[1]
    payload["commit"] = "per row (parts)"
    payload["parts"] = [
        {"name": p.name, "commit": p.commit, "systems": list(p.systems), "command": c}
        for p, c in zip(parts, commands, strict=True)
    ]
    write_seeds(out, md, payload)


def _run_command(payload: dict[str, Any], systems: Sequence[str]) -> str:
    """The benchmark command that ran ``systems`` in a seed table's ``payload``: its own, or where the
    table is itself a merge, that of the part that held them."""
    command = str(payload.get("command", ""))
    for part in payload.get("parts", []):
        if set(systems) <= set(part["systems"]):
            command = str(part["command"])
    return command.strip().removeprefix("Command: ").strip("`")


def block_tokens(parser: argparse.ArgumentParser, tokens: int) -> int:
    """``--block-tokens`` where :class:`Scenario` takes it as the simulation's block size (a positive
    multiple of the trace's blocks), else a usage error (exit 2) before anything runs."""
    try:
        Scenario(sim=SimConfig(block_size=tokens))
    except ValueError:
        parser.error(
            f"--block-tokens must be a positive multiple of the trace's {Scenario().trace_block_tokens} "
            f"tokens, got {tokens}"
        )
    return tokens


def planner_settings(args: argparse.Namespace, **kw: Any) -> PlannerSettings:
    """The planner's settings, with ``--min-relative-gain`` where given (the default otherwise)."""
    if args.min_relative_gain is not None:
        kw["min_relative_gain"] = args.min_relative_gain
    return PlannerSettings(**kw)


def label_gain(args: argparse.Namespace, by_seed: BySeed) -> None:
    """Name agentpool's rows after a ``--min-relative-gain`` other than the default, so a table run
    with it merges beside the default's (``python -m bench.sim_tables merge``)."""
    r = args.min_relative_gain
    if r is None or r == PlannerSettings().min_relative_gain:
        return
    for runs in by_seed.values():
        for run in runs:
            if run["system"] == "agentpool":
                run["system"] = f"agentpool (min gain {r:g})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sim_tables")
    sub = p.add_subparsers(dest="what", required=True)
    m = sub.add_parser("merge", help="one seed table from rows of several (run on different commits)")
    m.add_argument("out", help="results name: writes bench/results/sim_OUT.md and .json")
    m.add_argument(
        "--part", action="append", required=True, type=Part.parse, help="NAME@COMMIT=SYSTEM[,SYSTEM...]"
    )
    m.add_argument("--header", default=None, help="results name whose title and setting text to keep")
    args = p.parse_args(argv)
    merge(args.out, args.part, args.header)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
