"""``process_helpers.launch`` reads a service's output all along: a child that writes far more than
a pipe holds (64 KiB on Linux) is never blocked on a write, and every line reaches ``Proc.output``.
Started unread (``stdout=PIPE`` and nothing reading it), the same child blocks at its first write
past 64 KiB and never exits."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from process_helpers import launch

pytestmark = pytest.mark.integration

PIPE_BYTES = 64 << 10


async def test_a_child_writing_past_a_pipes_capacity_runs_to_its_end(tmp_path: Path) -> None:
    doc = tmp_path / "big.json"
    doc.write_text(json.dumps([f"line {i:06d}" for i in range(40_000)]))  # ~0.7 MB pretty-printed
    p = await launch("json.tool", "json.tool", str(doc))
    try:
        assert await asyncio.wait_for(p.proc.wait(), 30) == 0
    finally:
        await p.stop()
    assert len(p.text()) > 8 * PIPE_BYTES
    assert p.output[-2].strip() == '"line 039999"'
