"""`python -m agentpool.operator.lease`: two planners behind one Lease, as users (pods) start them."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from conftest import Cluster
from test_operator_kopf import eventually


async def _elector(cluster: Cluster, identity: str, marker: Path) -> asyncio.subprocess.Process:
    child = f"import pathlib, time; pathlib.Path({str(marker)!r}).write_text('{identity}'); time.sleep(600)"
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentpool.operator.lease",
        "--kubeconfig", str(cluster.kubeconfig), "--namespace", cluster.namespace, "--name", "sim-planner",
        "--identity", identity, "--duration-s", "4", "--renew-s", "0.5", "--grace-s", "5",
        "--", sys.executable, "-c", child,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip


async def test_one_holder_runs_the_command_and_hands_over_on_sigterm(
    cluster: Cluster, tmp_path: Path
) -> None:
    first_marker, second_marker = tmp_path / "a", tmp_path / "b"
    first = await _elector(cluster, "router-a", first_marker)

    async def started(marker: Path) -> bool:
        return await asyncio.to_thread(marker.exists)

    await eventually(lambda: started(first_marker), "the first holder's command")
    second = await _elector(cluster, "router-b", second_marker)
    await asyncio.sleep(3.0)
    assert not await started(second_marker), "two planners ran at once"
    lease = await cluster.api.get("Lease", cluster.namespace, "sim-planner")
    assert lease is not None and lease["spec"]["holderIdentity"] == "router-a"

    first.send_signal(signal.SIGTERM)
    out, _ = await asyncio.wait_for(first.communicate(), 30)
    assert first.returncode == 0, out.decode()
    await eventually(lambda: started(second_marker), "the second holder's command after the release")
    lease = await cluster.api.get("Lease", cluster.namespace, "sim-planner")
    assert lease is not None and lease["spec"]["holderIdentity"] == "router-b"
    assert lease["spec"]["leaseTransitions"] >= 1
    second.send_signal(signal.SIGTERM)
    await asyncio.wait_for(second.communicate(), 30)
