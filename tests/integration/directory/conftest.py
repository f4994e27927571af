"""Fixtures: a directory server on an ephemeral loopback port with its Redis state under a unique
namespace on the shared Redis (127.0.0.1:6379), deleted afterwards."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from process_helpers import delete_namespace

from agentpool.directory.client import DirectoryClient
from agentpool.directory.server import DirectoryConfig, DirectoryServer

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
async def namespace() -> AsyncIterator[str]:
    ns = f"agentpool-test:{uuid.uuid4().hex}"
    yield ns
    await delete_namespace(ns)


def config_for(namespace: str, **kw: object) -> DirectoryConfig:
    base: dict[str, object] = {
        "port": 0,
        "redis_url": REDIS_URL,
        "namespace": namespace,
        "page_size": 4,
        "sweep_interval_s": 0.05,
        "store_check_interval_s": 0.05,
    }
    base["insecure"] = "auth_token" not in kw  # the authentication tests set a token
    base.update(kw)
    return DirectoryConfig.model_validate(base)


@pytest.fixture
async def server(namespace: str) -> AsyncIterator[DirectoryServer]:
    srv = DirectoryServer(config_for(namespace))
    await srv.start()
    yield srv
    await srv.stop()


@pytest.fixture
async def client(server: DirectoryServer) -> AsyncIterator[DirectoryClient]:
    async with DirectoryClient(server.address) as c:
        yield c
