"""The Argo CD health check (Lua, as Argo CD runs it: `obj` in, `hs` out) on pool statuses."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "charts" / "agentpool" / "argocd" / "health.lua"
LUA = shutil.which("lua5.1") or shutil.which("lua")


def _lua_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"[{json.dumps(k)}] = {_lua_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "{" + ", ".join(_lua_value(v) for v in value) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def health(obj: dict[str, Any]) -> tuple[str, str]:
    if LUA is None:
        pytest.skip("no Lua interpreter (apt-get install lua5.1)")
    wrapped = f"local hs = (function() {SCRIPT.read_text()} end)()"
    program = f"obj = {_lua_value(obj)}\n{wrapped}\nprint(hs.status)\nprint(hs.message)"
    out = subprocess.run([LUA, "-"], input=program, capture_output=True, text=True, check=True).stdout
    status, message = out.split("\n", 1)
    return status, message.strip()


def pool(generation: int, observed: int | None, **conditions: tuple[str, str]) -> dict[str, Any]:
    status: dict[str, Any] = {
        "conditions": [
            {"type": k, "status": s, "reason": r, "message": f"{k} says {r}"}
            for k, (s, r) in conditions.items()
        ]
    }
    if observed is not None:
        status["observedGeneration"] = observed
    return {"metadata": {"generation": generation}, "status": status}


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"metadata": {"generation": 1}}, "Progressing"),
        (pool(1, 1, Ready=("True", "AllNodesServing"), Progressing=("False", "Stable")), "Healthy"),
        (pool(2, 1, Ready=("True", "AllNodesServing"), Degraded=("False", "Healthy")), "Progressing"),
        (pool(1, 1, Ready=("False", "NodesStarting"), Progressing=("True", "NodesStarting")), "Progressing"),
        (pool(3, 3, Ready=("False", "InvalidSpec"), Degraded=("True", "InvalidSpec")), "Degraded"),
        (pool(1, 1, Ready=("True", "AllNodesServing"), Degraded=("True", "EngineFailing")), "Degraded"),
    ],
)  # fmt: skip
def test_health(obj: dict[str, Any], expected: str) -> None:
    status, message = health(obj)
    assert status == expected, message
    if expected == "Degraded":
        assert "Degraded says" in message
