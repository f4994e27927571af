"""SGLang's HiCache L3 storage backend over the agent's host pool (runs inside SGLang's scheduler).

SGLang loads it with ``--hicache-storage-backend dynamic --hicache-storage-backend-extra-config
'{"backend_name": "agentpool", "module_path": "agentpool.engine.sglang.hicache_backend",
"class_name": "AgentPoolStorage", "agentpool_socket": ...}'`` (``args.py`` builds them): its
``StorageBackendFactory`` imports this module, checks that the class subclasses
``HiCacheStorage`` and calls ``AgentPoolStorage(storage_config, kwargs)`` in every TP rank's scheduler
process. Written against SGLang 0.5.23 (``sglang/srt/mem_cache/hicache_storage.py``,
``managers/cache_controller.py``): without ``interface_v1`` in the extra config its controller uses
the generic page path, ``batch_set(keys, [host_pool.get_data_page(i)])`` after a write-through and
``batch_exists`` + ``batch_get(keys, [host_pool.get_dummy_flat_data_page()])`` when a request's
prefix misses the device and host tiers, then ``set_from_flat_data_page``. The zero-copy
``batch_get_v1``/``batch_set_v1`` are implemented too.

Every page is copied into and out of the agent's pool (``l3_client.py``: a shared-memory file and a
Unix socket); the agent owns slots and eviction, and keeps the pages when SGLang's role switch calls
:meth:`AgentPoolStorage.clear`. A failed call to the agent (a full pool, the agent gone) is logged
and answered as SGLang's storage contract has it: a miss (``batch_exists`` 0, ``None`` pages, False
writes), never an exception in SGLang's prefetch or backup thread (an exception ends SGLang 0.5.23's
prefetch I/O thread). Imports SGLang and torch: only SGLang's processes import it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig

from agentpool.engine.sglang.l3_client import L3Client, L3Error, Page, key_suffix

log = logging.getLogger(__name__)

EXTRA_SOCKET = "agentpool_socket"


def _bytes(t: Any) -> Page:
    """A uint8 view of a CPU tensor's bytes (SGLang's host pool is CPU memory)."""
    out: Page = t.contiguous().view(torch.uint8).numpy().reshape(-1)
    return out


class AgentPoolStorage(HiCacheStorage):  # type: ignore[misc]  # SGLang's class, untyped here
    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Any = None) -> None:
        extra = storage_config.extra_config or {}
        path = extra.get(EXTRA_SOCKET)
        if not isinstance(path, str) or not path:
            raise ValueError(f"the agentpool storage backend needs {EXTRA_SOCKET!r} in its extra config")
        self.socket_path = Path(path)
        self.suffix = key_suffix(storage_config)
        self.client: L3Client | None = None
        self.mem_pool_host: Any = None

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        self.mem_pool_host = mem_pool_host
        page_bytes = int(_bytes(mem_pool_host.get_dummy_flat_data_page()).nbytes)
        self.client = L3Client(self.socket_path, page_bytes)  # the agent checks the page size

    def _c(self) -> L3Client:
        if self.client is None:
            raise RuntimeError("the agentpool storage backend is used before SGLang registered its host pool")
        return self.client

    def _keys(self, keys: list[str]) -> list[str]:
        return [k + self.suffix for k in keys]

    # -- the abstract interface ----------------------------------------------------------------
    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        try:
            return self._c().exists(self._keys(keys))
        except L3Error as e:
            log.warning("agentpool storage: exists of %d pages failed: %s", len(keys), e)
            return 0

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        return self.batch_get([key], [target_location])[0]

    def batch_get(self, keys: list[str], target_locations: Any = None, target_sizes: Any = None) -> list[Any]:
        if target_locations is None:
            target_locations = [self.mem_pool_host.get_dummy_flat_data_page() for _ in keys]
        ok = self._read(keys, [_bytes(t) for t in target_locations])
        return [t if hit else None for t, hit in zip(target_locations, ok, strict=True)]

    def _read(self, keys: list[str], dst: list[Page]) -> list[bool]:
        try:
            return self._c().read(self._keys(keys), dst)
        except L3Error as e:
            log.warning("agentpool storage: read of %d pages failed: %s", len(keys), e)
            return [False] * len(keys)

    def _write(self, keys: list[str], src: list[Page]) -> list[bool]:
        try:
            return self._c().write(self._keys(keys), src)
        except L3Error as e:
            log.warning("agentpool storage: write of %d pages failed: %s", len(keys), e)
            return [False] * len(keys)

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(
        self, keys: list[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None
    ) -> bool:
        return all(self._write(keys, [_bytes(v) for v in values]))

    # -- zero-copy interface (with ``interface_v1`` in the extra config) ------------------------
    def _page_indices(self, keys: list[str], host_indices: Any) -> list[int]:
        step = int(self.mem_pool_host.page_size)
        return [int(host_indices[i * step]) for i in range(len(keys))]

    def batch_get_v1(self, keys: list[str], host_indices: Any, extra_info: Any = None) -> list[bool]:
        pages = [self.mem_pool_host.get_dummy_flat_data_page() for _ in keys]
        ok = self._read(keys, [_bytes(p) for p in pages])
        for hit, page, idx in zip(ok, pages, self._page_indices(keys, host_indices), strict=True):
            if hit:
                self.mem_pool_host.set_from_flat_data_page(idx, page)
        return ok

    def batch_set_v1(self, keys: list[str], host_indices: Any, extra_info: Any = None) -> list[bool]:
        idx = self._page_indices(keys, host_indices)
        pages = [_bytes(self.mem_pool_host.get_data_page(i, flat=True)) for i in idx]
        return self._write(keys, pages)

    def clear(self) -> None:
        """Called by SGLang on ``/clear_hicache_storage_backend`` and on every role switch
        (``role_switch._release_prefix_cache_for_role_switch``); the agent keeps the pages while it
        switches roles, and drops them otherwise."""
        self._c().clear()

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


__all__ = ["AgentPoolStorage"]
