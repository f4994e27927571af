"""The example sim pool's children as the operator builds them, and readers of what each pod sees
(operator TLS tests)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from agentpool.api import AgentServingPool
from agentpool.operator.builders import BuildSettings, children
from agentpool.operator.names import PoolRef

ROOT = Path(__file__).resolve().parents[1]
SIM = yaml.safe_load((ROOT / "examples" / "pool-sim.yaml").read_text())
REF = PoolRef("sim", "team-a", "0000-uid")


def build_pool(auth: dict[str, Any]) -> list[dict[str, Any]]:
    """The children of the example sim pool with ``spec.auth`` set to ``auth`` (none if empty)."""
    manifest = copy.deepcopy(SIM)
    if auth:
        manifest["spec"]["auth"] = auth
    pool = AgentServingPool.model_validate(manifest)
    return children(REF, pool.spec, 1, BuildSettings())


def obj(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def pod(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = obj(objs, kind, name)["spec"]["template"]["spec"]
    return spec


def container(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in pod_spec["containers"] if c["name"] == name]
    return found


def secret_files(pod_spec: dict[str, Any], c: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Every file a container sees from a Secret: path -> (Secret, key)."""
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    out: dict[str, tuple[str, str]] = {}
    for m in c["volumeMounts"]:
        secret = volumes[m["name"]].get("secret")
        if secret is not None:
            for item in secret["items"]:
                out[f"{m['mountPath']}/{item['path']}"] = (secret["secretName"], item["key"])
    return out


def flags(args: list[str], prefix: str) -> dict[str, str]:
    return dict(a.split("=", 1) for a in args if a.startswith(prefix))


def planner_args(pod_spec: dict[str, Any]) -> list[str]:
    """The planner's own flags (its command runs behind the lease wrapper)."""
    command: list[str] = container(pod_spec, "planner")["command"]
    return command[command.index("agentpool.planner") + 1 :]
