"""Branch headers drive the real directory service (gRPC, state in Redis), and its prefixes drive routing."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest
from process_helpers import delete_namespace
from router_engine_standin import StandIn
from router_harness import chat_body, router_config, start_router

from agentpool.directory.client import DirectoryClient, DirectoryRpcError, NodePublisher
from agentpool.directory.server import DirectoryConfig, DirectoryServer
from agentpool.kv import ROOT_HASH, Role, Tier, block_hashes
from agentpool.router.__main__ import directory_view
from agentpool.router.directory_view import DirectoryError
from agentpool.router.grpc_directory import GrpcDirectoryView
from agentpool.router.tokenizer import BuiltinTokenizer, encode_chat

pytestmark = pytest.mark.integration
REDIS_URL = "redis://127.0.0.1:6379/0"
PAGE = 16


@pytest.fixture
async def directory() -> AsyncIterator[DirectoryServer]:
    namespace = f"agentpool-router-test:{uuid.uuid4().hex}"
    srv = DirectoryServer(
        DirectoryConfig(
            port=0,
            redis_url=REDIS_URL,
            namespace=namespace,
            page_size=PAGE,
            sweep_interval_s=0.05,
            insecure=True,
        )
    )
    await srv.start()
    yield srv
    await srv.stop()
    await delete_namespace(namespace)


async def branch_exists(client: DirectoryClient, branch: str) -> bool:
    try:
        await client.place(branch, "a")
    except DirectoryRpcError as e:
        assert e.code == grpc.StatusCode.NOT_FOUND and "unknown branch" in e.reason, e
        return False
    return True


async def placed(directory: DirectoryServer, branch: str, within_s: float = 2.0) -> None:
    """The router sends its Place on its Route stream without waiting for it: it lands shortly."""
    deadline = asyncio.get_running_loop().time() + within_s
    while branch not in directory.service.dir.branches:
        assert asyncio.get_running_loop().time() < deadline, f"the router never placed {branch}"
        await asyncio.sleep(0.01)


async def test_headers_drive_branch_ends_and_prefixes_drive_routing(directory: DirectoryServer) -> None:
    a, b = await StandIn("a", tokens=2).start(), await StandIn("b", tokens=2).start()
    client = DirectoryClient(directory.address)
    stream = client.open_events()
    pub_a, pub_b = NodePublisher(stream, "a", Role.BOTH), NodePublisher(stream, "b", Role.BOTH)
    await pub_a.resync([])
    await pub_b.resync([])
    text = " ".join(f"w{i}" for i in range(200))
    ids = encode_chat(BuiltinTokenizer(), [{"role": "user", "content": text}]).token_ids
    await pub_b.stored(ROOT_HASH, block_hashes(ids, PAGE), Tier.GPU)  # b holds the whole prompt

    view = GrpcDirectoryView(DirectoryClient(directory.address))
    router = await start_router(
        router_config([("a", a.url, "both"), ("b", b.url, "both")], policy="evolving", pageSize=PAGE), view
    )
    try:
        async with aiohttp.ClientSession() as http:
            hdr = {"x-agentpool-branch": "agent-1"}
            async with http.post(
                f"{router.url}/v1/chat/completions", json=chat_body(text), headers=hdr
            ) as resp:
                assert resp.status == 200
            assert [r.request_id for r in b.received] and not a.received  # the prefix holder won
            assert b.received[0].cached_tokens == len(ids) // PAGE * PAGE
            await placed(directory, "agent-1")
            assert await branch_exists(client, "agent-1")

            end = {"x-agentpool-branch": "agent-1", "x-agentpool-branch-end": "true"}
            async with http.post(
                f"{router.url}/v1/chat/completions", json=chat_body(text), headers=end
            ) as resp:
                assert resp.status == 200
            assert not await branch_exists(client, "agent-1")

            fork = {"x-agentpool-branch": "agent-2", "x-agentpool-parent-branch": "agent-1"}
            async with http.post(
                f"{router.url}/v1/chat/completions", json=chat_body(text), headers=fork
            ) as resp:
                assert resp.status == 200
            await placed(directory, "agent-2")
            assert await branch_exists(client, "agent-2")
            async with http.delete(f"{router.url}/v1/branches/agent-2") as resp:
                assert resp.status == 200
                assert (await resp.json())["deleted"] is True
            assert not await branch_exists(client, "agent-2")
            async with http.delete(f"{router.url}/v1/branches/agent-2") as resp:
                assert resp.status == 404
            async with http.get(f"{router.url}/metrics") as resp:
                metrics = await resp.text()
            local = len(ids) // PAGE * PAGE
            assert f'agentpool_router_prefix_tokens_total{{kind="local"}} {3 * local}.0' in metrics
            assert "agentpool_router_directory_errors_total{" not in metrics
    finally:
        await router.stop()
        await view.close()
        await stream.close()
        await client.close()
        await a.kill()
        await b.kill()


async def test_router_reaches_a_token_protected_directory(tmp_path: Path) -> None:
    namespace = f"agentpool-router-test:{uuid.uuid4().hex}"
    srv = DirectoryServer(
        DirectoryConfig(
            port=0, redis_url=REDIS_URL, namespace=namespace, page_size=PAGE, auth_token="s3cret-dir-token"
        )
    )
    await srv.start()
    token_file = tmp_path / "token"
    try:
        token_file.write_text("wrong-dir-token!\n")
        denied = directory_view(srv.address, PAGE, token_file=token_file)
        with pytest.raises(DirectoryError):
            await denied.resolve(block_hashes(list(range(64)), PAGE), None, None)
        await denied.close()  # type: ignore[attr-defined]
        token_file.write_text("s3cret-dir-token\n")
        allowed = directory_view(srv.address, PAGE, token_file=token_file)
        resolved = await allowed.resolve(block_hashes(list(range(64)), PAGE), None, None)
        assert resolved.prefixes == {}
        await allowed.close()  # type: ignore[attr-defined]
    finally:
        await srv.stop()


async def test_the_queue_limit_holds_under_concurrency_with_the_grpc_directory(
    directory: DirectoryServer,
) -> None:
    """choose() and taking the queue slot are one step: the branch's Place RPC (an await) comes after.

    Before, 40 concurrent branch requests all chose the node while its count was 0, then awaited
    Place, then dispatched: the node got all 40 against a limit of 4.
    """
    a = await StandIn("a", tokens=1, prefill_s=0.05).start()
    view = GrpcDirectoryView(DirectoryClient(directory.address))
    config = router_config([("a", a.url, "both")], pageSize=PAGE, maxQueuePerNode=4, maxRequeues=0)
    router = await start_router(config, view)
    try:
        async with aiohttp.ClientSession() as http:

            async def one(i: int) -> int:
                hdr = {"x-agentpool-branch": f"agent-{i}"}
                body = chat_body(f"question {i}", max_tokens=1)
                async with http.post(f"{router.url}/v1/chat/completions", json=body, headers=hdr) as resp:
                    await resp.read()
                    return resp.status

            statuses = await asyncio.gather(*(one(i) for i in range(40)))
        assert a.max_waiting <= 4, (a.max_waiting, statuses)
        assert statuses.count(200) >= 4 and statuses.count(429) > 0, statuses
        assert set(statuses) <= {200, 429}, statuses
    finally:
        await router.stop()
        await a.kill()
