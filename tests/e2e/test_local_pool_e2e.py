"""End to end: the local pool (real Redis, directory, 4 sim engines with NIXL, router) under a live
replay, with a role switch written where the planner writes it and an engine killed mid-run.

- every request completes, except ones that had started streaming on the engine that was killed;
- a decode -> prefill switch under load loses no request (a request bound to the decode node before
  it began draining is bound to another decode node); the engine serves its new role;
- the directory drops the killed engine's blocks (within its 5 s node timeout);
- branch ends reach the directory: when the replay is over no branch is open and every count is 0.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest
from local_trace import write_small_trace
from process_helpers import free_port

from agentpool.directory.client import DirectoryClient, DirectoryRpcError
from agentpool.local.file_roles import FileRoleBoard
from agentpool.local.live_report import EngineRoles
from agentpool.local.pool import LocalOptions, load_manifest, local_ports
from agentpool.local.replay import ReplaySettings
from agentpool.local.run_replay import replay
from agentpool.local.up import LocalPool
from agentpool.sim.trace import load_claude_code

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MANIFEST = """
apiVersion: agentpool.io/v1alpha1
kind: AgentServingPool
metadata: {name: e2e}
spec:
  model: {name: e2e-model, experts: {active: 8, total: 128}}
  engine: {backend: sim, image: local, gpusPerNode: 0, hostKvSize: 32Mi}
  nodes: 4
  initialSplit: {prefill: 2}
  slo: {ttft: {base: 2s, perKiloToken: 20ms}, tpot: 50ms}
  planner: {enabled: false}
  router: {policy: evolving}
"""


async def wait_for(check, within: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, f"{what} not within {within} s"
        await asyncio.sleep(0.25)


async def test_local_pool_end_to_end(tmp_path: Path) -> None:
    manifest = tmp_path / "pool.yaml"
    manifest.write_text(MANIFEST)
    pool = load_manifest(manifest)
    conversations = load_claude_code(write_small_trace(tmp_path / "trace.jsonl", sessions=40))
    options = LocalOptions(router_port=free_port(), planner=False, ports=local_ports())
    async with LocalPool(pool, options, workdir=tmp_path / "pool", say=lambda _: None) as local:
        plan = local.plan
        assert plan is not None
        settings = ReplaySettings(
            url=plan.router_url, model=plan.model, agents=24, duration_s=45.0, time_scale=4.0,
            shared_prefix_tokens=128, drain_s=60.0,
        )  # fmt: skip
        token = (plan.workdir / "directory-token").read_text().strip()
        async with (
            aiohttp.ClientSession() as session,
            DirectoryClient(plan.directory_target, token=token) as d,
        ):
            board = FileRoleBoard(plan.roles_dir, plan.engine_urls, session)
            roles = EngineRoles(plan.engine_urls, session)
            run = asyncio.create_task(
                replay(settings, conversations, split_source=lambda s: EngineRoles(plan.engine_urls, s))
            )
            await asyncio.sleep(12)
            assert await roles() == (2, 2, 0)
            await board.set_role("engine-3", "prefill")  # what the planner writes for a D->P switch

            async def switched() -> bool:
                return await roles() == (3, 1, 0)

            await wait_for(switched, 20, "engine-3 serving prefill")
            assert (await d.health()).nodes == 4
            await asyncio.sleep(5)
            assert await d.eviction_order("engine-0")  # it holds blocks
            await local.supervisor.kill("engine-0")  # a prefill engine dies mid-run

            async def dropped() -> bool:
                if (await d.health()).nodes != 3:
                    return False
                with pytest.raises(DirectoryRpcError, match="unknown node 'engine-0'"):
                    await d.eviction_order("engine-0")
                return True

            await wait_for(dropped, 15, "the directory dropping engine-0")
            result = await run
            s = result["summary"]
            assert s["sent"] >= 100, s
            # nothing lost but requests that were streaming from the engine that was killed
            assert s["completed"] + s["failed"] == s["sent"]
            assert s["failed"] == s["failed_after_first_token"], result["errors"]
            assert s["failed"] <= 8, result["errors"]
            killed = (plan.engine_urls["engine-0"], "engine-0")
            assert all(any(k in e for k in killed) for e in result["errors"]), result["errors"]
            print(f"\nsent {s['sent']}, completed {s['completed']}, failed {s['failed']}: {result['errors']}")
            assert s["hit_rate"] > 0.3  # later turns reuse earlier turns' KV through the directory
            splits = [tuple(row[1:]) for row in result["split_timeline"]]
            assert splits[0] == (2, 2, 0) and (3, 1, 0) in splits  # (1 draining in between)
            assert splits[-1] == (2, 1, 1)  # after the kill: engine-0 answers no more
            health = await d.health()
            assert health.branches == 0  # branch ends (headers and DELETE at stop) reached the directory
            for node in ("engine-1", "engine-2", "engine-3"):  # the engines still up
                assert all(e.count == 0 for e in await d.eviction_order(node)), node
            assert health.nodes == 3 and health.blocks > 0
