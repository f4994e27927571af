"""Run the operator: ``python -m agentpool.operator [--namespace NS ... | --all-namespaces]``.

It watches `AgentServingPool` objects and reconciles them (see :mod:`agentpool.operator.handlers`).
Credentials: in a pod, its service account; elsewhere `--kubeconfig` or the usual kubeconfig lookup
(`$KUBECONFIG`, `~/.kube/config`). SIGTERM/SIGINT stop it cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import sys
import threading

import kopf
from kubernetes import client as k8s
from kubernetes import config as kube_config

from agentpool.operator.builders import BuildSettings
from agentpool.operator.handlers import build_registry, post_event
from agentpool.operator.kube import KubeApi
from agentpool.operator.reconcile import Reconciler


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m agentpool.operator", description="agentpool's Kubernetes operator"
    )
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("--namespace", action="append", default=[], help="watch this namespace (repeatable)")
    scope.add_argument(
        "--all-namespaces", "-A", action="store_true", help="watch every namespace (the default)"
    )
    p.add_argument(
        "--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then the usual lookup)"
    )
    p.add_argument(
        "--control-plane-image",
        default=os.environ.get("AGENTPOOL_CONTROL_PLANE_IMAGE", BuildSettings().control_plane_image),
        help="image of the router, planner and directory (env AGENTPOOL_CONTROL_PLANE_IMAGE)",
    )
    p.add_argument(
        "--status-interval-s", type=float, default=5.0, help="how often each pool's status is refreshed"
    )
    p.add_argument(
        "--drain-timeout-s", type=float, default=300.0, help="longest wait for a leaving engine to drain"
    )
    p.add_argument(
        "--liveness", default=None, help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz"
    )
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    if args.status_interval_s <= 0 or args.drain_timeout_s <= 0:
        p.error("--status-interval-s and --drain-timeout-s must be positive")
    return args


def client_configuration(kubeconfig: str | None) -> k8s.Configuration:
    configuration = k8s.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        kube_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        kube_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
    return configuration


async def run(args: argparse.Namespace, stop: asyncio.Event | threading.Event | None = None) -> None:
    configuration = client_configuration(args.kubeconfig)
    api = KubeApi(k8s.ApiClient(configuration))
    reconciler = Reconciler(
        api,
        BuildSettings(control_plane_image=args.control_plane_image),
        token=lambda: secrets.token_urlsafe(32),
        events=post_event,
        drain_timeout_s=args.drain_timeout_s,
    )
    registry = build_registry(reconciler, configuration, args.status_interval_s)
    await kopf.operator(
        registry=registry,
        clusterwide=not args.namespace,
        namespaces=list(args.namespace),
        standalone=True,
        liveness_endpoint=args.liveness,
        stop_flag=stop,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        asyncio.run(run(args))
    except kube_config.ConfigException as exc:
        print(f"cannot load Kubernetes credentials: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
