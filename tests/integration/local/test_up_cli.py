"""`agentpool up` from its command line: starts real processes, stops them all, fails cleanly."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from process_helpers import free_port

from agentpool.local.supervisor import ProcessSpec, StartError, Supervisor, TcpReady

pytestmark = pytest.mark.integration
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "pool-sim.yaml"


def processes_mentioning(text: str) -> list[int]:
    """Pids of processes whose command line contains ``text`` (the pool's work directory)."""
    return [
        pid
        for pid in (int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit())
        if pid != os.getpid() and text in cmdline(pid)
    ]


def cmdline(pid: int) -> str:
    """The process's command line, arguments joined by spaces ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def up(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "agentpool.cli", "up", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def read_until_ready(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """`up`'s output until it says the pool is up (or ``timeout_s`` passed); fails if `up` exits first."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line, "agentpool up exited: " + "".join(lines)
        lines.append(line)
        if "Ctrl-C stops everything" in line:
            break
    return "".join(lines)


def test_up_starts_the_control_plane_and_sigterm_leaves_nothing(tmp_path: Path) -> None:
    work = tmp_path / "work"
    port = free_port()
    proc = up("-f", str(EXAMPLE), "--port", str(port), "--no-engines", "--workdir", str(work))
    text = read_until_ready(proc, 60)
    assert f"http://127.0.0.1:{port}/v1" in text and "grpc://127.0.0.1:" in text and "redis://" in text
    children = processes_mentioning(str(work))
    assert len(children) >= 2  # directory and router name files in the work directory
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "no process left running" in out
    assert processes_mentioning(str(work)) == []


SMALL_POOL = """
apiVersion: agentpool.io/v1alpha1
kind: AgentServingPool
metadata: {name: small}
spec:
  model: {name: small-model}
  engine: {backend: sim, image: local, gpusPerNode: 0, hostKvSize: 16Mi}
  nodes: 2
  initialSplit: {prefill: 1}
  slo: {ttft: {base: 2s}, tpot: 50ms}
  planner: {warmup: 10m}
"""


def test_up_with_engines_and_planner_serves_and_ctrl_c_leaves_nothing(tmp_path: Path) -> None:
    manifest = tmp_path / "pool.yaml"
    manifest.write_text(SMALL_POOL)
    work = tmp_path / "work"
    port = free_port()
    proc = up("-f", str(manifest), "--port", str(port), "--workdir", str(work))
    text = read_until_ready(proc, 120)
    for name in ("redis", "directory", "engine-0", "engine-1", "router", "planner"):
        assert f"{name} " in text, text
    body = json.dumps(
        {
            "model": "small-model",
            "stream": True,
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}],
        }
    ).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", body, {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        stream = r.read().decode()
    assert stream.rstrip().endswith("data: [DONE]") and '"content":"' in stream
    children = processes_mentioning(str(work))
    assert len(children) >= 5  # directory, two engines, router, planner name files in the work directory
    proc.send_signal(signal.SIGINT)  # Ctrl-C
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert processes_mentioning(str(work)) == []
    started = [int(m) for m in re.findall(r"ready \(pid (\d+)\)", text)]  # redis-server included
    assert len(started) == 6
    assert all(not Path(f"/proc/{pid}").exists() for pid in {*children, *started})


def test_port_in_use_is_a_clear_error_and_nothing_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        work = tmp_path / "work"
        proc = up("-f", str(EXAMPLE), "--port", str(port), "--no-engines", "--workdir", str(work))
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert f"port {port} on 127.0.0.1 is in use" in out
    assert "Traceback" not in out
    assert processes_mentioning(str(work)) == []


def test_bad_manifest_from_the_command_line(tmp_path: Path) -> None:
    bad = tmp_path / "pool.yaml"
    bad.write_text(EXAMPLE.read_text().replace("  nodes: 6\n", "  nodes: -1\n"))
    proc = up("-f", str(bad), "--no-engines")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert out.count("\n") == 1 and "spec.nodes" in out, out


async def test_a_failed_start_stops_what_was_started(tmp_path: Path) -> None:
    port = free_port()
    sleeper = ProcessSpec(
        "sleeper", [sys.executable, "-c", "import time; time.sleep(600)"], None, tmp_path / "a.log"
    )
    server = ProcessSpec(
        "server",
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        TcpReady("127.0.0.1", port),
        tmp_path / "b.log",
    )
    broken = ProcessSpec(
        "broken",
        [sys.executable, "-c", "print('cannot start: no config'); raise SystemExit(3)"],
        TcpReady("127.0.0.1", free_port()),
        tmp_path / "c.log",
    )
    async with Supervisor(grace_s=5) as sup:
        with pytest.raises(StartError, match=r"(?s)broken exited with code 3.*cannot start: no config"):
            await sup.start_all([sleeper, server, broken])
        assert sup.running == []
    for spec in (sleeper, server):
        assert processes_mentioning(" ".join(spec.argv[1:])) == []


def test_up_keeps_the_logs_when_a_process_exits(tmp_path: Path) -> None:
    """Without --workdir the work directory is temporary: when a process of the pool exits on its own,
    `up` keeps the pool's logs in a new directory and says where, so the failure can be diagnosed."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    port = free_port()
    proc = up("-f", str(EXAMPLE), "--port", str(port), "--no-engines", env=env)
    text = read_until_ready(proc, 60)
    found = re.search(r"work directory (\S+) ", text)
    assert found, text
    work = found.group(1)
    routers = [pid for pid in processes_mentioning(work) if "agentpool.router" in cmdline(pid)]
    assert len(routers) == 1
    os.kill(routers[0], signal.SIGKILL)  # an essential process dies: the pool ends
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    kept = re.search(r"the pool's logs are in (\S+)", out)
    assert kept, out
    logs = Path(kept.group(1))
    assert logs.parent.parent == tmp_path and not Path(work).exists()
    assert "router listening" in (logs / "router.log").read_text()
    assert {"directory.log", "redis.log"} <= {p.name for p in logs.iterdir()}
    assert processes_mentioning(work) == []
