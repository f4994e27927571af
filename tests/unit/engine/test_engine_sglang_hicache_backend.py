"""The agent's HiCache storage backend loaded by SGLang's own ``StorageBackendFactory`` (the
``dynamic`` backend, with the extra config ``args.py`` passes), against the agent's real L3 store
and shared-memory host pool; pages as SGLang's page-first host pool hands them out (bf16 tensors).

Needs SGLang and torch importable (SGLang 0.5.23's ``hicache_storage`` imports torch, triton,
psutil, pybase64 and msgspec: about 2 GB, which CI does not install): skipped otherwise. Run it as
``pip install torch==2.13.0 triton psutil pybase64 msgspec && pip install --no-deps sglang==0.5.23``
in a virtual environment.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from agentpool.engine.hostpool import HostPool
from agentpool.engine.sglang.args import storage_extra_config
from agentpool.engine.sglang.l3_index import L3Index
from agentpool.engine.sglang.l3_store import SHM_NAME, L3StoreServer, prepare_run_dir

if importlib.util.find_spec("sglang") is None or importlib.util.find_spec("torch") is None:
    pytest.skip(
        "SGLang and torch are not installed here (about 2 GB; CI leaves them out): the backend's "
        "conformance to SGLang's HiCacheStorage and factory is checked where they are",
        allow_module_level=True,
    )

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig
from sglang.srt.mem_cache.storage import StorageBackendFactory

LAYERS, HEADS, DIM, PAGE = 2, 2, 8, 4
PAGE_BYTES = LAYERS * 2 * PAGE * HEADS * DIM * 2  # K and V, bf16


class PageFirstHost:
    """SGLang 0.5.23's page-first host pool, as far as a storage backend sees it
    (``pool_host/mha.py``: one row of ``kv_buffer`` per page)."""

    page_size = PAGE

    def __init__(self, pages: int) -> None:
        self.kv_buffer = torch.zeros(pages, LAYERS, 2 * PAGE * HEADS * DIM, dtype=torch.bfloat16)

    def get_data_page(self, index: int, flat: bool = True) -> Any:
        page = self.kv_buffer[int(index) // PAGE]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self) -> Any:
        return torch.zeros(LAYERS, 2 * PAGE * HEADS * DIM, dtype=torch.bfloat16).flatten()

    def set_from_flat_data_page(self, index: int, data_page: Any) -> None:
        self.kv_buffer[int(index) // PAGE].copy_(data_page.view(torch.bfloat16).reshape(LAYERS, -1))


def storage_config(socket_path: str, tp_rank: int = 0) -> Any:
    return HiCacheStorageConfig(
        tp_rank=tp_rank,
        tp_size=2,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=False,
        enable_storage_metrics=False,
        is_page_first_layout=True,
        model_name="m",
        extra_config=json.loads(storage_extra_config(socket_path)),
    )


async def test_sglangs_factory_loads_the_backend_and_pages_survive_a_switchs_clear(tmp_path: Path) -> None:
    run = prepare_run_dir(tmp_path, "n")
    pool = HostPool(16, PAGE_BYTES, shm_path=run / SHM_NAME)
    index = L3Index(pool)
    server = L3StoreServer(index, run)
    await server.start()
    try:

        def sglang_side() -> None:
            host = PageFirstHost(8)
            torch.manual_seed(0)
            host.kv_buffer.normal_()
            backend = StorageBackendFactory.create_backend("dynamic", storage_config(str(server.path)), host)
            assert isinstance(backend, HiCacheStorage)
            backend.register_mem_pool_host(host)  # as the cache controller does after creating it
            keys = ["a" * 64, "b" * 64, "c" * 64]
            # the generic path of SGLang's cache controller: batch_set of get_data_page(...)
            assert backend.batch_set(keys, [host.get_data_page(i * PAGE) for i in range(3)])
            assert backend.batch_exists([*keys, "d" * 64]) == 3 and backend.exists(keys[0])
            # another TP rank keys its own shard apart
            other = StorageBackendFactory.create_backend("dynamic", storage_config(str(server.path), 1), host)
            other.register_mem_pool_host(host)
            assert other.batch_exists(keys) == 0
            index.switching = True  # the agent marked the switch; SGLang's switch calls clear()
            backend.clear()
            index.switching = False
            assert backend.batch_exists(keys) == 3
            got = backend.batch_get(keys, [host.get_dummy_flat_data_page() for _ in keys])
            for i, page in enumerate(got):
                assert page is not None and torch.equal(
                    page.view(torch.int16), host.get_data_page(i * PAGE).view(torch.int16)
                )
            # the zero-copy interface: straight into host pages 5..7
            fresh = PageFirstHost(8)
            backend.register_mem_pool_host(fresh)
            idx = torch.arange(5 * PAGE, 8 * PAGE)
            assert backend.batch_get_v1(keys, idx) == [True, True, True]
            assert torch.equal(fresh.kv_buffer[5:8].view(torch.int16), host.kv_buffer[0:3].view(torch.int16))
            assert backend.batch_set_v1(["e" * 64], torch.arange(5 * PAGE, 6 * PAGE)) == [True]
            backend.clear()  # not a switch: dropped
            assert backend.batch_exists(keys) == 0
            other.close()
            return backend

        backend = await asyncio.to_thread(sglang_side)
        # the agent gone: misses, as SGLang's storage contract has it, never an exception in its threads
        await server.close()

        def after() -> None:
            host = PageFirstHost(2)
            assert backend.batch_exists(["a" * 64]) == 0
            assert backend.batch_get(["a" * 64], [host.get_dummy_flat_data_page()]) == [None]
            assert backend.batch_set(["a" * 64], [host.get_data_page(0)]) is False
            assert backend.batch_get_v1(["a" * 64], torch.arange(0, PAGE)) == [False]
            backend.close()

        await asyncio.to_thread(after)
        assert index.kept_clears == 1 and index.dropped_clears == 1
    finally:
        await server.close()
        pool.close()


def test_a_page_size_other_than_the_pools_block_is_refused_at_registration(tmp_path: Path) -> None:
    async def run() -> None:
        d = prepare_run_dir(tmp_path, "n")
        pool = HostPool(4, PAGE_BYTES * 2, shm_path=d / SHM_NAME)
        server = L3StoreServer(L3Index(pool), d)
        await server.start()
        try:
            backend = StorageBackendFactory.create_backend("dynamic", storage_config(str(server.path)), None)
            with pytest.raises(Exception, match="SGLang's page is 512 bytes, the pool's blocks 1024"):
                await asyncio.to_thread(backend.register_mem_pool_host, PageFirstHost(2))
        finally:
            await server.close()
            pool.close()

    asyncio.run(run())
