"""``python -m agentpool.router`` starts from a config file and serves."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from process_helpers import free_port

pytestmark = pytest.mark.integration


def test_module_entry_point_serves_models_and_metrics(tmp_path: Path) -> None:
    config = tmp_path / "router.yaml"
    config.write_text(
        "model: cli-model\npolicy: smetric\nnodes: [{id: a, url: 'http://127.0.0.1:9', role: both}]\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentpool.router",
            "--config",
            str(config),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--insecure-allow-unauthenticated-reports",
            "--insecure-engines-without-token",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1) as r:
                    models = json.loads(r.read())
                break
            except OSError:
                assert time.monotonic() < deadline, "router did not start"
                time.sleep(0.1)
        assert models["data"][0]["id"] == "cli-model"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            assert b"agentpool_router_queue_depth_requests" in r.read()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        err = proc.stderr.read() if proc.stderr is not None else b""
        if proc.stderr is not None:
            proc.stderr.close()
    assert proc.returncode == 0, err
    assert b"load reports are NOT authenticated" in err
