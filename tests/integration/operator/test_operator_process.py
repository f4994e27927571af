"""The operator as users start it: `python -m agentpool.operator`, a subprocess, against the API."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from conftest import Cluster
from test_operator_kopf import CHILDREN, condition, create_pool, eventually, pool, pool_manifest, versions


async def test_the_operator_process_reconciles_and_stops_on_sigterm(cluster: Cluster) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentpool.operator",
        "--kubeconfig", str(cluster.kubeconfig),
        "-A",  # KMock cannot list namespaces, which --namespace needs
        "--status-interval-s", "0.5",
        "--control-plane-image", "registry.test/agentpool:9",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ},
    )  # fmt: skip
    try:
        await create_pool(cluster, pool_manifest(cluster))

        async def children_exist() -> bool:
            return len(await versions(cluster)) == len(CHILDREN)

        await eventually(children_exist, "every child, made by the operator process")
        router = await cluster.api.get("Deployment", cluster.namespace, "sim-router")
        assert router is not None
        images = {c["image"] for c in router["spec"]["template"]["spec"]["containers"]}
        assert images == {"registry.test/agentpool:9"}

        async def has_status() -> bool:
            return condition(await pool(cluster), "Ready") is not None

        await eventually(has_status, "a status")
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, output.decode()[-3000:]
    assert b"generation 1 reconciled" in output


async def test_bad_credentials_fail_with_a_clear_message(tmp_path: object) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentpool.operator", "--kubeconfig", "/nonexistent/kubeconfig",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 1
    assert b"cannot load Kubernetes credentials" in output
