"""``agentpool demo``: a local pool (``up``) and a live replay of the bundled Claude Code sample.

The defaults finish in about four minutes on two cores: the pool of ``data/demo-pool.yaml`` (four
sim engines, a 30 s planner warmup and 40 s windows), 12 agents for a 30 s warmup and 150 s
measured, recorded pauses divided by 10 and capped at 5 s, outputs capped at 128 tokens. The
report shows the live run's throughput, latency percentiles, hit rate and lost KV reuse and the
split over time (the engines' served roles), beside the simulator's run of the same workload on
the same pool (``--no-sim`` leaves it out). The pool's per-process logs are kept in ``logs/`` of the
report directory (replacing an earlier run's), and a run that ends with failed requests says where.
"""

from __future__ import annotations

import dataclasses
import time
from importlib import resources
from pathlib import Path
from typing import Any

import aiohttp

from agentpool.api import AgentServingPool
from agentpool.local.live_report import EngineRoles, Progress, SplitSource
from agentpool.local.pool import LocalOptions, model_context_length
from agentpool.local.pool_sim import apply_pool, pool_system
from agentpool.local.replay import ReplaySettings
from agentpool.local.run_replay import ReplayOutput, Slo, replay, write_reports
from agentpool.local.up import LocalPool, endpoints_text
from agentpool.sim.presets import preset as node_preset
from agentpool.sim.run import Scenario, run_system
from agentpool.sim.trace import Conversation


def demo_manifest() -> Path:
    return Path(str(resources.files("agentpool.local").joinpath("data/demo-pool.yaml")))


def context_limit(pool: AgentServingPool, preset_name: str) -> int:
    """The longest request the demo replays: the sim engines serve at most their preset's context
    (and KV), the router at most the pool's ``spec.model.contextLength``. The live run and the
    simulator's replay both leave out what a longer request would have led to
    (:func:`agentpool.sim.trace.cap_context`), so they stay one workload."""
    kv = node_preset(preset_name).gpu_kv_tokens
    context = model_context_length(pool, preset_name)  # what the sim engines take (local.pool)
    return kv if context is None else min(kv, context)


def scaled(conversations: list[Conversation], time_scale: float) -> list[Conversation]:
    """The conversations with their recorded pauses divided by ``time_scale`` (for the simulator,
    which caps pauses but does not scale them)."""
    out = []
    for c in conversations:
        reqs = [dataclasses.replace(r, delay_s=r.delay_s / time_scale) for r in c.requests]
        out.append(dataclasses.replace(c, requests=tuple(reqs)))
    return out


def simulated(
    pool: AgentServingPool, settings: ReplaySettings, conversations: list[Conversation], preset: str
) -> dict[str, Any]:
    """The simulator's run of the same workload on the same pool (the manifest's system), with the
    node model the sim engines run: ``preset``'s Eq. 1/2 coefficients as the ground truth, no noise."""
    sc = apply_pool(
        Scenario(
            preset=preset,
            agents=settings.agents,
            shared_prefix_tokens=settings.shared_prefix_tokens,
            max_pause_s=settings.max_pause_s,
            warmup_s=settings.warmup_s,
            duration_s=settings.duration_s,
        ),
        pool,
    )
    sim = dataclasses.replace(sc.sim, block_size=conversations[0].block_size, truth="equations", noise=0.0)
    sc = dataclasses.replace(sc, sim=sim)
    convs = scaled(conversations, settings.time_scale)
    if settings.max_output_tokens is not None:
        cap = settings.max_output_tokens
        convs = [
            dataclasses.replace(
                c,
                requests=tuple(
                    dataclasses.replace(r, output_tokens=min(r.output_tokens, cap)) for r in c.requests
                ),
            )
            for c in convs
        ]
    name = pool_system(pool)
    result = run_system(name, sc, convs)
    result["system"] = f"simulated {name}"
    return result


async def run_demo(
    pool: AgentServingPool,
    options: LocalOptions,
    settings_for: Any,
    conversations: list[Conversation],
    out: ReplayOutput,
    slo: Slo,
    with_sim: bool = True,
    quiet: bool = False,
) -> int:
    """``settings_for(router_url, model)`` gives the replay settings once the pool is up."""
    t0 = time.monotonic()
    print(f"agentpool demo: starting a local pool of {pool.spec.nodes} sim engines ...", flush=True)
    async with LocalPool(pool, options) as local:
        assert local.plan is not None
        plan = local.plan
        print(endpoints_text(plan).replace("Ctrl-C stops everything.", ""), flush=True)
        settings: ReplaySettings = settings_for(plan.router_url, plan.model)
        print(
            f"replaying the Claude Code sample: {settings.agents} agents, {settings.warmup_s:.0f} s warmup + "
            f"{settings.duration_s:.0f} s measured (pauses / {settings.time_scale:g}, at most "
            f"{settings.max_pause_s} s) ...",
            flush=True,
        )

        def roles(session: aiohttp.ClientSession) -> SplitSource:
            return EngineRoles(plan.engine_urls, session)

        live = await replay(
            settings,
            conversations,
            slo,
            split_source=roles,
            progress=Progress(enabled=False if quiet else None),
            name=f"live {pool.metadata.get('name', 'pool')}",
        )
        exited = [r.spec.name for r in local.supervisor.exited()]
        if out.directory is not None:
            local.keep_logs = out.directory / "logs"
    failed = live["summary"]["failed"]
    results = [live]
    if with_sim:
        print("simulating the same workload on the same pool ...", flush=True)
        results.append(simulated(pool, settings, conversations, options.preset))
    text = write_reports(
        out, settings, results, {"pool": pool.metadata.get("name"), "nodes": pool.spec.nodes}
    )
    print(text)
    if exited:
        print(f"processes that exited during the run: {', '.join(exited)}")
    if out.directory is not None:
        print(f"wrote {out.directory}/report.md, results.json" + (" and PNG plots" if out.plots else ""))
    kept = local.kept_logs
    if failed or exited:
        what = f"{failed} request(s) failed" + (f", {len(exited)} process(es) exited" if exited else "")
        where = (
            f"the pool's logs are in {kept}/ (router.log names each failed request and its engine)"
            if kept is not None
            else "the pool's logs are gone (no report directory)"
        )
        print(f"agentpool demo: {what}; {where}", flush=True)
    elif kept is not None:
        print(f"the pool's logs (one per process) are in {kept}/")
    print(f"demo took {time.monotonic() - t0:.0f} s; every process of the pool is stopped")
    return 0 if failed == 0 else 1
