"""The planner process: Kubernetes client, router polling, settings reload, the controller.

``python -m agentpool.planner --namespace NS --pool NAME --router http://router-0:8000 [...]``

- Kubernetes: ``--in-cluster`` (service account) or ``--kubeconfig PATH`` (default: the usual
  kubeconfig lookup). The engine pods are those matching ``--selector`` (default
  ``agentpool.io/pool=<pool>``); Events are about the ``AgentServingPool`` (its uid from
  ``--pool-uid``, else read from the API when readable).
- Routers: each ``--router`` URL (repeat the flag, one per router pod) and, with
  ``--router-selector``, every running pod it matches (``http://<pod IP>:--router-port``, listed
  again before every poll, so replicas that come and go are followed).
- Data: every ``--poll-interval-s`` each router is polled for work records, occupancy, the
  engines' iteration records and the role each engine serves, which engines send with their load
  reports
  (:mod:`agentpool.planner.router_source`). Until engines send iteration records, every warmup
  fits nothing and is repeated (logged), and the pool stays colocated.
- Models out: every router gets each node's fitted model after the fit and after every
  window (:mod:`agentpool.planner.router_models`), with the bearer token of
  ``--router-token-file`` (the routers' ``reportToken``; unset: the per-user ``report`` token file of
  ``agentpool.secret_file.local_tokens``, as for the directory's token). ``https://`` routers:
  ``--router-ca-file``, and for mutual TLS ``--router-client-cert-file``/``--router-client-key-file``
  (a router with a client CA takes a verified certificate for the token). Routers found by
  ``--router-selector`` are reached at their pod IPs over ``--router-scheme`` (``http`` by
  default); over ``https`` their certificates are checked against ``--router-server-name`` (the
  router Service's name, which the operator passes), since no certificate names a pod IP.
- Directory: with ``--directory HOST:PORT`` (token: ``--directory-token-file``; TLS:
  ``--directory-ca-file``, mutual TLS: ``--directory-client-cert-file``/``--directory-client-key-file``)
  the planner tells the KV directory when an engine serves its new phase (``SwitchPhase``; D->P
  resets its counts).
- Settings: ``--settings FILE`` and/or the flags (flags win); the file is re-read while running
  (:mod:`agentpool.planner.settings_file`).
- State across restarts: ConfigMap ``--state-configmap`` (default ``<pool>-planner-state``;
  ``""`` turns it off) (:mod:`agentpool.planner.state`). The same ConfigMap gets, whenever it
  changes, the settings generation the planner and each router run (``loaded.json``), for the
  operator's status.
- Metrics: ``--metrics-port`` (0: none) serves ``agentpool_planner_*``.

SIGTERM or SIGINT stops it cleanly (exit 0); a startup failure exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from prometheus_client import CollectorRegistry, start_http_server

from agentpool.directory.auth import read_client_tls
from agentpool.directory.client import DirectoryClient
from agentpool.models import MoeShape, OccupancyCount
from agentpool.planner.controller import PlannerController, PlannerError
from agentpool.planner.inbox import PlannerInbox
from agentpool.planner.kube import ObjectRef, PodRoles, RouterPods
from agentpool.planner.metrics import PlannerMetrics
from agentpool.planner.roles import ServedRoles
from agentpool.planner.router_models import ModelBroadcast
from agentpool.planner.router_source import RouterWorkSource
from agentpool.planner.settings_file import PlannerSettings
from agentpool.planner.state import ConfigMapStateStore, LoadedGenerations
from agentpool.secret_file.local_tokens import router_and_directory_tokens
from agentpool.secret_file.tls import optional_client_context

log = logging.getLogger("agentpool.planner")

GROUP, VERSION, PLURAL, KIND = "agentpool.io", "v1alpha1", "agentservingpools", "AgentServingPool"
SETTING_FLAGS = (
    ("window_s", float, "planning window T_win (s)"),
    ("slices", int, "slices per window (m)"),
    ("warmup_s", float, "colocated warmup T_learn (s)"),
    ("cooldown_s", float, "no switch this long after one (s)"),
    ("min_prefill", int, "minimum prefill nodes"),
    ("min_decode", int, "minimum decode nodes"),
    ("initial_prefill", int, "prefill nodes of the split disaggregation starts from"),
    ("min_relative_gain", float, "least gain of a switch, as a fraction of the current throughput"),
    ("refit_margin", float, "refit: a record beyond margin x the fitted range is out of range"),
    ("refit_min_records", int, "refit: out-of-range records a window needs"),
    ("refit_min_share", float, "refit: their least share of the window's records"),
    ("refit_max_error", float, "refit: only when the model's mean relative error on them exceeds this"),
    ("refit_max_records", int, "refit: records a refit fits on, at most"),
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m agentpool.planner", description="agentpool's prefill/decode split planner"
    )
    p.add_argument("--namespace", required=True, help="the pool's namespace")
    p.add_argument("--pool", required=True, help="the AgentServingPool's name")
    p.add_argument("--pool-uid", default=None, help="its uid (default: read from the API)")
    p.add_argument("--selector", default=None, help="engine pods (default agentpool.io/pool=<pool>)")
    p.add_argument("--router", action="append", default=[], help="a router's base URL (repeatable)")
    p.add_argument(
        "--router-selector", default=None, help="label selector of the router pods (found every poll)"
    )
    p.add_argument("--router-port", type=int, default=8000, help="the router pods' HTTP port")
    p.add_argument(
        "--router-scheme", choices=("http", "https"), default="http", help="how the router pods are reached"
    )
    p.add_argument(
        "--router-server-name",
        default=None,
        help="the name the routers' certificates are checked against (default: each URL's host; "
        "give the router Service's name where pods are reached at their IPs)",
    )
    p.add_argument("--poll-interval-s", type=float, default=5.0)
    p.add_argument(
        "--router-token-file",
        type=Path,
        default=None,
        help="bearer token for pushing models to routers (default: the per-user report token file)",
    )
    p.add_argument("--router-ca-file", type=Path, default=None, help="CA (PEM) of https:// routers")
    p.add_argument(
        "--router-client-cert-file",
        type=Path,
        default=None,
        help="client certificate (PEM) for the routers: mutual TLS (it stands for the report token there)",
    )
    p.add_argument("--router-client-key-file", type=Path, default=None, help="its private key (PEM)")
    p.add_argument(
        "--directory", default=None, help="KV directory HOST:PORT, told when an engine switches phase"
    )
    p.add_argument(
        "--directory-token-file",
        type=Path,
        default=None,
        help="the directory's token (default: the per-user file)",
    )
    p.add_argument("--directory-ca-file", type=Path, default=None, help="CA (PEM): TLS to the directory")
    p.add_argument(
        "--directory-client-cert-file", type=Path, default=None, help="client certificate (PEM): mutual TLS"
    )
    p.add_argument("--directory-client-key-file", type=Path, default=None, help="its private key (PEM)")
    auth = p.add_mutually_exclusive_group()
    auth.add_argument("--in-cluster", action="store_true", help="use the pod's service account")
    auth.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: the usual lookup)")
    p.add_argument("--settings", type=Path, default=None, help="planner settings file (YAML/JSON), reloaded")
    for name, kind, text in SETTING_FLAGS:
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=None, help=text)
    p.add_argument("--enabled", choices=("true", "false"), default=None, help="evaluate windows")
    p.add_argument("--refit", choices=("true", "false"), default=None, help="refit models beyond their range")
    p.add_argument(
        "--occupancy", choices=[c.value for c in OccupancyCount], default=None, help="what q̄ counts"
    )
    p.add_argument("--experts-active", type=int, default=0, help="routed experts per token (0: dense)")
    p.add_argument("--experts-total", type=int, default=0, help="routed experts (0: dense)")
    p.add_argument("--state-configmap", default=None, help="state ConfigMap ('' = none)")
    p.add_argument("--inbox-keep-s", type=float, default=7200.0)
    p.add_argument("--metrics-port", type=int, default=0)
    p.add_argument("--log-level", default="INFO")
    return p


def setting_flags(args: argparse.Namespace) -> dict[str, Any]:
    flags: dict[str, Any] = {n: getattr(args, n) for n, _, _ in SETTING_FLAGS if getattr(args, n) is not None}
    for name in ("enabled", "refit"):
        if getattr(args, name) is not None:
            flags[name] = getattr(args, name) == "true"
    if args.occupancy is not None:
        flags["occupancy"] = OccupancyCount(args.occupancy)
    return flags


def api_client(args: argparse.Namespace) -> k8s.ApiClient:
    """A client from the service account or a kubeconfig (file I/O: call it in a thread)."""
    configuration = k8s.Configuration()
    if args.in_cluster:
        k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=args.kubeconfig, client_configuration=configuration
        )
    return k8s.ApiClient(configuration)


async def pool_ref(api: k8s.ApiClient, args: argparse.Namespace) -> ObjectRef:
    uid = args.pool_uid
    if uid is None:
        objects = k8s.CustomObjectsApi(api)
        try:
            pool = await asyncio.to_thread(
                objects.get_namespaced_custom_object, GROUP, VERSION, args.namespace, PLURAL, args.pool
            )
            meta = pool.get("metadata", {}) if isinstance(pool, dict) else {}
            uid = meta.get("uid")
        except ApiException as e:
            log.warning(
                "pool %s/%s not readable (%s): Events carry no uid", args.namespace, args.pool, e.status
            )
    return ObjectRef(f"{GROUP}/{VERSION}", KIND, args.pool, args.namespace, uid)


async def run(args: argparse.Namespace, stop: asyncio.Event) -> int:
    """Run until ``stop`` (0) or until the controller fails (1)."""
    try:
        if not args.router and not args.router_selector:
            raise ValueError("no router: give --router URL (repeatable) and/or --router-selector")
        settings = PlannerSettings(setting_flags(args), args.settings)
        shape = MoeShape(args.experts_active, args.experts_total)
        router_token, directory_token = await asyncio.to_thread(
            router_and_directory_tokens,
            args.router_token_file,
            args.directory_token_file,
            bool(args.directory),
        )
        directory_tls = await asyncio.to_thread(
            read_client_tls,
            args.directory_ca_file,
            args.directory_client_cert_file,
            args.directory_client_key_file,
        )
        router_tls = await asyncio.to_thread(
            optional_client_context,
            args.router_ca_file,
            args.router_client_cert_file,
            args.router_client_key_file,
            "the routers",
        )
        if args.router_server_name is not None and router_tls is None and args.router_scheme == "http":
            raise ValueError("--router-server-name names the routers' TLS certificates: it needs https")
        api = await asyncio.to_thread(api_client, args)
    except (ValueError, ConfigException, OSError) as e:
        log.error("planner not started: %s", e)
        return 1
    registry = CollectorRegistry()
    if args.metrics_port:
        start_http_server(args.metrics_port, registry=registry)
    try:
        pool = await pool_ref(api, args)
        inbox = PlannerInbox(keep_s=args.inbox_keep_s)
        state_name = f"{args.pool}-planner-state" if args.state_configmap is None else args.state_configmap
        store = ConfigMapStateStore(api, args.namespace, state_name, pool) if state_name else None
        served = ServedRoles()  # from the routers' work batches
        controller = PlannerController(
            pods=PodRoles(api, args.namespace, args.selector or f"agentpool.io/pool={args.pool}", served),
            inbox=inbox,
            config=settings,
            pool=pool,
            metrics=PlannerMetrics(registry),
            shape=shape,
            state=store,
            kv_capacity=served,  # decode capacity is bounded by each engine's reported KV room
        )
        async with contextlib.AsyncExitStack() as stack:
            connector = aiohttp.TCPConnector(ssl=True if router_tls is None else router_tls)
            session = await stack.enter_async_context(aiohttp.ClientSession(connector=connector))
            server_name = args.router_server_name
            broadcast = ModelBroadcast(args.router, session, token=router_token, server_hostname=server_name)
            controller.models_out = broadcast
            if args.directory:
                controller.directory = await stack.enter_async_context(
                    DirectoryClient(
                        args.directory,
                        token=directory_token,
                        root_certificates=directory_tls.root_certificates,
                        client_cert=directory_tls.client_cert,
                        client_key=directory_tls.client_key,
                    )
                )
            routers = None
            if args.router_selector:
                selector, port, scheme = args.router_selector, args.router_port, args.router_scheme
                routers = RouterPods(api, args.namespace, selector, port, scheme).urls
            source = RouterWorkSource(
                args.router,
                inbox,
                session,
                interval_s=args.poll_interval_s,
                models=broadcast,
                discover=routers,
                served=served,
                server_hostname=server_name,
            )
            reporter = None
            if store is not None:
                report = report_loaded(store, settings, source, stop, args.poll_interval_s)
                reporter = asyncio.create_task(report)
            try:
                code = await drive(
                    controller, source, settings, stop, (ApiException, PlannerError, ValueError)
                )
            finally:
                stop.set()
                if reporter is not None:
                    await reporter
        if code == 0:
            log.info("planner stopped")
        return code
    finally:
        await asyncio.to_thread(api.close)


async def report_loaded(
    store: ConfigMapStateStore,
    settings: PlannerSettings,
    source: RouterWorkSource,
    stop: asyncio.Event,
    interval_s: float,
) -> None:
    """Every ``interval_s`` until ``stop``: which settings generation the planner and each router
    run, saved when it changed (a failed write is logged and tried again next time)."""
    written: LoadedGenerations | None = None
    while not stop.is_set():
        loaded = LoadedGenerations(planner=settings.generation, routers=source.config_generations())
        if loaded != written:
            try:
                await store.save_loaded(loaded)
                written = loaded
            except ApiException as e:
                log.warning("loaded generations not reported (%s %s)", e.status, e.reason)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval_s)


async def drive(
    controller: PlannerController,
    source: RouterWorkSource,
    settings: PlannerSettings,
    stop: asyncio.Event,
    errors: tuple[type[Exception], ...],
) -> int:
    """Run the controller with its work source and settings reload until ``stop`` (0) or until it
    fails with one of ``errors`` (1, logged); the two helpers are stopped and awaited either way.
    Shared by this planner and the local pool's (``agentpool.local.planner``)."""
    helpers = [asyncio.create_task(source.run(stop)), asyncio.create_task(settings.run(stop))]
    try:
        await controller.run(stop)
    except errors as e:
        log.error("planner stopped: %s", e)
        return 1
    finally:
        stop.set()
        await asyncio.gather(*helpers)
    return 0


async def serve_until_signal(
    run: Callable[[argparse.Namespace, asyncio.Event], Awaitable[int]], args: argparse.Namespace
) -> int:
    """``run(args, stop)`` with ``stop`` set by SIGTERM or SIGINT; the handlers are removed after."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        return await run(args, stop)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):
                loop.remove_signal_handler(sig)


async def serve(args: argparse.Namespace) -> int:
    return await serve_until_signal(run, args)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(serve(args))
