"""The Redis store against the same property histories as the memory store, plus its key layout."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import uuid
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from process_helpers import delete_namespace

from agentpool.directory.redis_store import RedisBranchStore
from agentpool.directory.store import snapshot
from agentpool.kv import Directory, Role

pytestmark = pytest.mark.integration

REDIS_URL = "redis://127.0.0.1:6379/0"


_KV_TESTS = Path(__file__).parents[2] / "unit" / "kv"
if str(_KV_TESTS) not in sys.path:
    sys.path.insert(0, str(_KV_TESTS))  # kv_reference, the history driver the property tests share
_spec = importlib.util.spec_from_file_location(
    "kv_count_properties", _KV_TESTS / "test_kv_counts_properties.py"
)
assert _spec is not None and _spec.loader is not None
props = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = props
_spec.loader.exec_module(props)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(props.ops, max_size=30))
def test_random_histories_redis_store(history: list[object]) -> None:
    ns = f"agentpool-test:{uuid.uuid4().hex}"
    store = RedisBranchStore(aioredis.Redis.from_url(REDIS_URL), ns, idle_ttl_s=60)
    try:
        props.check_history(history, store)
    finally:
        asyncio.run(delete_namespace(ns))


async def test_key_layout_hash_tags_and_ttl() -> None:
    namespace = f"agentpool-test:{uuid.uuid4().hex}"
    client = aioredis.Redis.from_url(REDIS_URL)
    store = RedisBranchStore(client, namespace, idle_ttl_s=30)
    d = Directory(page_size=1)
    await store.save(snapshot(d, d.register_node("p1", Role.PREFILL)))
    res = d.resolve([11, 12], "agent/7", 1.0)
    await store.save(snapshot(d, res.changes))
    await store.save(snapshot(d, d.place("agent/7", "p1", 1.0)))
    key = f"{namespace}:branch:{{agent/7}}"
    assert await client.exists(key) == 1
    assert 30 < await client.ttl(key) <= 90  # idle limit + 60 s margin: the directory's sweep comes first
    assert await client.hget(f"{namespace}:nodes", "p1") == b"prefill"
    row = await client.hgetall(key)
    assert set(row) == {b"v", b"p", b"s", b"c:p1"}
    phases, rows = await store.load()
    assert phases == {"p1": Role.PREFILL} and [r.branch_id for r in rows] == ["agent/7"]
    await store.save(snapshot(d, d.end_branch("agent/7")))
    assert await client.exists(key) == 0
    await client.aclose()
    await delete_namespace(namespace)
