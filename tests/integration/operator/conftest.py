"""Fixtures: a Kubernetes API (KMock with bookkeeping, or the real server AGENTPOOL_TEST_KUBECONFIG
names), the controllers played through it, and the operator running against it."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kmock
import kubernetes.config.kube_config
import pytest
import yaml
from kube_emulation import POOL_RESOURCE, BookkeepingEmulator, Controllers, Engines, pool_resource_info
from kubernetes import client as k8s

from agentpool.api.crd import custom_resource_definition
from agentpool.operator.__main__ import parse_args, run
from agentpool.operator.kube import KubeApi

ROOT = Path(__file__).resolve().parents[3]


@dataclass
class Cluster:
    api: KubeApi
    namespace: str
    kubeconfig: Path
    real: bool
    engines: Engines
    emulator: BookkeepingEmulator | None = None
    """KMock itself (None on a real server), for tests that make it misbehave."""


def _kubeconfig(server: str, path: Path) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "kmock", "cluster": {"server": server}}],
                "users": [{"name": "test", "user": {"token": "test-token"}}],
                "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "test"}}],
                "current-context": "kmock",
            }
        )
    )
    return path


def _api(path: Path) -> KubeApi:
    configuration = k8s.Configuration()
    kubernetes.config.load_kube_config(config_file=str(path), client_configuration=configuration)
    return KubeApi(k8s.ApiClient(configuration))


async def _install_crd(path: Path, namespace: str) -> None:
    def install() -> None:
        api_client = kubernetes.config.new_client_from_config(config_file=str(path))
        ext = k8s.ApiextensionsV1Api(api_client)
        body = custom_resource_definition()
        try:
            current = ext.read_custom_resource_definition(body["metadata"]["name"])
            body["metadata"]["resourceVersion"] = current.metadata.resource_version
            ext.replace_custom_resource_definition(body["metadata"]["name"], body)
        except k8s.ApiException as exc:
            if exc.status != 404:
                raise
            ext.create_custom_resource_definition(body)
        k8s.CoreV1Api(api_client).create_namespace({"metadata": {"name": namespace}})

    await asyncio.to_thread(install)


def _delete_namespace(path: Path, namespace: str) -> None:
    api_client = kubernetes.config.new_client_from_config(config_file=str(path))
    try:
        k8s.CoreV1Api(api_client).delete_namespace(namespace)
    except k8s.ApiException as exc:
        if exc.status != 404:
            raise


@pytest.fixture
async def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Cluster]:
    real = os.environ.get("AGENTPOOL_TEST_KUBECONFIG")
    namespace = f"asp-{uuid.uuid4().hex[:8]}"
    stop = asyncio.Event()
    if real:
        path = Path(real)
        await _install_crd(path, namespace)
        monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
        api = _api(path)
        controllers = asyncio.create_task(Controllers(api, namespace).run(stop))
        try:
            yield Cluster(api, namespace, path, True, Engines(api, namespace))
        finally:
            stop.set()
            await controllers
            await asyncio.to_thread(_delete_namespace, path, namespace)
        return
    async with BookkeepingEmulator() as emulator, kmock.Server(emulator) as server:
        emulator.resources.load_bundled()
        emulator.resources[POOL_RESOURCE] = pool_resource_info()
        path = _kubeconfig(str(server.url), tmp_path / "kubeconfig")
        # kopf's login and the kubernetes client find the test server where they look by default
        monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
        api = _api(path)
        controllers = asyncio.create_task(Controllers(api, namespace).run(stop))
        try:
            yield Cluster(api, namespace, path, False, Engines(api, namespace), emulator)
        finally:
            stop.set()
            await controllers


class OperatorThread:
    """The operator in its own thread and event loop, as `kopf run` would run it: kopf cancels
    every task it did not find when it started, so it must not share the tests' loop."""

    def __init__(self, argv: list[str]) -> None:
        self.args = parse_args(argv)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="operator", daemon=True)

    def _main(self) -> None:
        try:
            asyncio.run(run(self.args, self.stop))
        except BaseException as exc:  # noqa: BLE001 - handed to the test that asserts on it
            self.error = exc

    async def __aenter__(self) -> OperatorThread:
        self.thread.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        # joined in a worker thread: this loop serves KMock, which the operator needs to stop
        self.stop.set()
        await asyncio.to_thread(self.thread.join, 30)
        assert not self.thread.is_alive(), "the operator did not stop within 30 s"
        assert self.error is None, self.error


OPERATOR_ARGS = ["-A", "--status-interval-s", "0.3", "--drain-timeout-s", "60"]


@pytest.fixture
async def operator(cluster: Cluster) -> AsyncIterator[OperatorThread]:
    """The operator, in this process, with fast status refreshes and a short drain timeout."""
    async with OperatorThread(OPERATOR_ARGS) as running:
        yield running


def load_example(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "examples" / name).read_text())
    return loaded
