"""Engines that die are purged within seconds; publishers survive a directory that dies and comes back;
Redis with AOF (everysec) restarted loses no branch counts. Every process is started from its command
line."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import grpc
import pytest
from directory_processes import (
    PYTHONPATH,
    TOKEN,
    PrivateRedis,
    eventually,
    free_port,
    start_directory_process,
)

from agentpool.directory.client import (
    DirectoryClient,
    DirectoryRpcError,
    EventStreamClosedError,
    NodePublisher,
)
from agentpool.directory.service import DEFAULT_NODE_TIMEOUT_S
from agentpool.engine.directory_link import DirectoryLink
from agentpool.kv import ROOT_HASH, HeldBlock, Role, Tier

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
GH = Tier.GPU | Tier.HOST


def chain(n: int, start: int = 1) -> list[HeldBlock]:
    hs = [start + i for i in range(n)]
    return [HeldBlock(h, hs[i - 1] if i else ROOT_HASH, GH) for i, h in enumerate(hs)]


async def stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


async def test_an_engine_killed_with_sigkill_is_purged_within_5_s(namespace: str) -> None:
    """The defaults: the directory's node timeout and the engine agent's heartbeats."""
    directory, address = await start_directory_process(
        namespace, "--node-timeout-s", str(DEFAULT_NODE_TIMEOUT_S)
    )
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    script = str(HERE / "publisher_process.py")
    publisher = await asyncio.create_subprocess_exec(
        sys.executable, script, address, TOKEN, "e1", "2000", stdout=asyncio.subprocess.PIPE, env=env
    )
    try:
        assert publisher.stdout is not None
        line = await asyncio.wait_for(publisher.stdout.readline(), 30)
        assert line.strip() == b"published", line
        async with DirectoryClient(address, token=TOKEN) as client:
            await client.place("agent", "e1", [h.block_hash for h in chain(3)])
            await asyncio.sleep(DEFAULT_NODE_TIMEOUT_S + 1)  # alive past the timeout: heartbeats keep it
            assert (await client.health()).nodes == 1
            publisher.send_signal(signal.SIGKILL)
            await publisher.wait()
            killed = time.monotonic()

            async def purged() -> bool:
                return (await client.health()).nodes == 0

            await eventually(purged, within=10)
            took = time.monotonic() - killed
            print(f"purged {took:.2f} s after SIGKILL")
            assert took < 5.0, f"purged {took:.1f}s after SIGKILL"
            assert (await client.health()).blocks == 0
            res = await client.resolve([h.block_hash for h in chain(3)], "agent")
            assert res.nodes == {} and res.branch is not None and res.branch.counted_nodes == ()
    finally:
        await stop(publisher)
        await stop(directory)


async def test_a_publisher_survives_the_directory_dying_and_resyncs_when_it_is_back(namespace: str) -> None:
    port = free_port()
    directory, address = await start_directory_process(namespace, port=port)
    try:
        async with DirectoryClient(address, token=TOKEN) as client:
            bare = NodePublisher(client.open_events(), "raw", Role.PREFILL)
            assert not (await bare.resync(chain(2, start=1000))).resync_requested
            held = chain(50)
            link = DirectoryLink(
                "e1", client, lambda: Role.PREFILL, lambda: held, lambda c, s: None,
                heartbeat_s=0.2, reconnect_s=0.1,
            )  # fmt: skip
            task = asyncio.create_task(link.run())

            async def indexed() -> bool:
                try:
                    return (await client.health()).blocks == 50 + 2
                except DirectoryRpcError:
                    return False

            await eventually(indexed)
            directory.kill()
            await directory.wait()
            with pytest.raises(EventStreamClosedError) as err:  # the client's own error, not asyncio's
                await bare.stored(1001, [1002], Tier.GPU)
            assert err.value.code is grpc.StatusCode.UNAVAILABLE
            with pytest.raises(EventStreamClosedError):
                await bare.heartbeat()
            await bare.stream.close()  # closing a dead stream is quiet
            await asyncio.sleep(0.5)
            assert not task.done(), "the link died with the directory"
            errors = link.errors

            directory, _ = await start_directory_process(namespace, port=port)

            async def back() -> bool:  # a new process: the index is rebuilt from the link's resync
                try:
                    return (await client.health()).blocks == 50
                except DirectoryRpcError:
                    return False

            await eventually(back, within=15)
            assert link.errors > errors and link.resyncs >= 2
            res = await client.resolve([h.block_hash for h in held])
            assert res.nodes["e1"].local_blocks == 50
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)  # before the client closes
    finally:
        await stop(directory)


async def test_redis_with_aof_everysec_restarted_loses_no_branch_counts(namespace: str) -> None:
    """The durability the chart and the local pool configure: appendonly yes, appendfsync everysec.
    Redis is killed (SIGKILL) more than a second after the last write and restarted on its data."""
    async with PrivateRedis(appendfsync="everysec") as redis:
        await restart_redis_and_the_directory(namespace, redis)


async def restart_redis_and_the_directory(namespace: str, redis: PrivateRedis) -> None:
    directory, address = await start_directory_process(namespace, "--redis-url", redis.url)
    try:
        async with DirectoryClient(address, token=TOKEN) as client:
            for node in ("p1", "p2"):
                await client.switch_phase(node, Role.PREFILL)
            idle = [h.block_hash for h in chain(8)]
            for i in range(20):  # idle branches: placed once, never ended
                await client.place(f"agent-{i}", f"p{1 + i % 2}", idle[: 2 + i % 6])
            before = {n: await counts(client, n) for n in ("p1", "p2")}
            assert before["p1"][idle[0]] == 10
            await asyncio.sleep(1.5)  # everysec: written and fsynced within a second
            await redis.kill()

            async def unhealthy() -> bool:
                return not (await client.health()).serving

            await eventually(unhealthy)
            await redis.start()

            async def healthy() -> bool:
                return (await client.health()).serving

            await eventually(healthy, within=15)  # reloaded from what Redis kept
            assert {n: await counts(client, n) for n in ("p1", "p2")} == before
            assert (await client.health()).branches == 20
        await stop(directory)
        directory, address = await start_directory_process(namespace, "--redis-url", redis.url)
        async with DirectoryClient(address, token=TOKEN) as client:  # a fresh process on that Redis
            assert {n: await counts(client, n) for n in ("p1", "p2")} == before
    finally:
        await stop(directory)


async def counts(client: DirectoryClient, node: str) -> dict[int, int]:
    stream = client.watch_counts(node)
    first = await asyncio.wait_for(anext(stream), 5)
    await stream.aclose()
    return first.counts
