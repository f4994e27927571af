"""Run a command only while holding a Kubernetes Lease: one active planner per pool.

`python -m agentpool.operator.lease --namespace NS --name LEASE --identity ID -- CMD ARGS...`

The router pods run the planner behind this wrapper, so during a rollout (two router pods) only
one planner acts. The wrapper takes the Lease when it is free or expired (its holder stopped
renewing for `--duration-s`), starts the command, renews every `--renew-s`, and stops the command
(SIGTERM, then SIGKILL after `--grace-s`) and exits 1 the moment it cannot renew: the container
restarts and competes again. On SIGTERM it stops the command and releases the Lease at once, so
the next holder need not wait for it to expire. Conflicting writes lose (optimistic concurrency on
`resourceVersion`), so two wrappers never both believe they hold it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client as k8s

from agentpool.operator.kube import KubeApi, KubeConflict, KubeError

log = logging.getLogger("agentpool.operator.lease")
MICRO = "%Y-%m-%dT%H:%M:%S.%fZ"


@dataclass(frozen=True, slots=True)
class Holder:
    identity: str | None
    renewed: datetime | None
    duration_s: float

    @staticmethod
    def of(lease: Mapping[str, Any] | None) -> Holder:
        spec = (lease or {}).get("spec") or {}
        renewed = spec.get("renewTime")
        when = datetime.strptime(renewed, MICRO).replace(tzinfo=UTC) if renewed else None
        return Holder(spec.get("holderIdentity"), when, float(spec.get("leaseDurationSeconds") or 0))


def may_take(holder: Holder, identity: str, now: datetime) -> bool:
    """Whether `identity` may take (or keep) the Lease: free, its own, or expired."""
    if holder.identity in (None, "", identity) or holder.renewed is None:
        return True
    return now - holder.renewed > timedelta(seconds=holder.duration_s)


def lease_body(namespace: str, name: str, identity: str | None, duration_s: float, now: datetime,
               resource_version: str | None, transitions: int) -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if resource_version is not None:
        meta["resourceVersion"] = resource_version
    stamp = now.strftime(MICRO)
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": meta,
        "spec": {
            "holderIdentity": identity,
            "leaseDurationSeconds": int(duration_s),
            "acquireTime": stamp,
            "renewTime": stamp,
            "leaseTransitions": transitions,
        },
    }


class Elector:
    def __init__(self, api: KubeApi, namespace: str, name: str, identity: str, duration_s: float) -> None:
        self.api, self.namespace, self.name = api, namespace, name
        self.identity, self.duration_s = identity, duration_s

    async def try_hold(self) -> bool:
        """Take or renew the Lease; False if another holder has it (or won a race for it)."""
        now = datetime.now(UTC)
        lease = await self.api.get("Lease", self.namespace, self.name)
        holder = Holder.of(lease)
        if not may_take(holder, self.identity, now):
            return False
        transitions = int(((lease or {}).get("spec") or {}).get("leaseTransitions") or 0)
        if lease is not None and holder.identity != self.identity:
            transitions += 1  # a new holder, also after a release
        version = lease["metadata"]["resourceVersion"] if lease is not None else None
        body = lease_body(
            self.namespace, self.name, self.identity, self.duration_s, now, version, transitions
        )
        if lease is not None and holder.identity == self.identity:
            body["spec"]["acquireTime"] = lease["spec"].get("acquireTime", body["spec"]["acquireTime"])
        try:
            await (self._update(body) if lease is not None else self.api.create(body))
        except KubeConflict:
            return False
        return True

    async def release(self) -> None:
        lease = await self.api.get("Lease", self.namespace, self.name)
        if lease is None or Holder.of(lease).identity != self.identity:
            return
        version = lease["metadata"]["resourceVersion"]
        transitions = int(lease["spec"].get("leaseTransitions") or 0)
        now = datetime.now(UTC)
        body = lease_body(self.namespace, self.name, None, self.duration_s, now, version, transitions)
        with contextlib.suppress(KubeError):
            await self._update(body)

    async def _update(self, body: dict[str, Any]) -> None:
        """A merge patch carrying `resourceVersion`: the server refuses it (409) if the Lease
        changed since it was read, so two contenders never both win."""
        await self.api.merge_patch("Lease", self.namespace, self.name, body)


async def _stop(process: asyncio.subprocess.Process, grace_s: float) -> int:
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), grace_s)
        except TimeoutError:
            process.kill()
            await process.wait()
    return int(process.returncode or 0)


async def run(args: argparse.Namespace, api: KubeApi) -> int:
    elector = Elector(api, args.namespace, args.name, args.identity, args.duration_s)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    while not await _safe_hold(elector):
        log.info("lease %s held by another; waiting", args.name)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), args.renew_s)
        if stop.is_set():
            return 0
    log.info("lease %s acquired by %s; starting %s", args.name, args.identity, args.command[0])
    process = await asyncio.create_subprocess_exec(*args.command)
    exited = asyncio.ensure_future(process.wait())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        while True:
            await asyncio.wait({exited, stopping}, timeout=args.renew_s, return_when=asyncio.FIRST_COMPLETED)
            if exited.done():
                log.info("command exited with %s", process.returncode)
                return int(process.returncode or 0)
            if stopping.done():  # asked to stop: a clean exit, whatever the command answered
                await _stop(process, args.grace_s)
                return 0
            if not await _safe_hold(elector):
                log.error("lease %s lost: stopping the command", args.name)
                await _stop(process, args.grace_s)
                return 1
    finally:
        stopping.cancel()
        await elector.release()


async def _safe_hold(elector: Elector) -> bool:
    try:
        return await elector.try_hold()
    except KubeError as exc:
        log.warning("lease: %s", exc)
        return False


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m agentpool.operator.lease", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--namespace", required=True)
    p.add_argument("--name", required=True, help="the Lease")
    p.add_argument("--identity", required=True, help="this holder (e.g. the pod name)")
    p.add_argument(
        "--duration-s", type=float, default=15.0, help="a holder that stops renewing loses it after this"
    )
    p.add_argument("--renew-s", type=float, default=5.0)
    p.add_argument("--grace-s", type=float, default=20.0, help="SIGTERM to SIGKILL of the command")
    p.add_argument("--kubeconfig", default=None, help="default: in-cluster, then the usual lookup")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = p.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        p.error("give the command to run after --")
    if not 0 < args.renew_s < args.duration_s:
        p.error("--renew-s must be positive and shorter than --duration-s")
    return args


def main(argv: list[str] | None = None) -> int:
    from agentpool.operator.__main__ import client_configuration

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    api = KubeApi(k8s.ApiClient(client_configuration(args.kubeconfig)))
    return asyncio.run(run(args, api))


if __name__ == "__main__":
    sys.exit(main())
