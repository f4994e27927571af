"""Fixtures of the engine integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from engine_processes import Pool


@pytest.fixture
async def pool(tmp_path: Path) -> AsyncIterator[Pool]:
    """A router and engines from their command lines (:class:`Pool`), all stopped afterwards."""
    pool = Pool(tmp_path)
    try:
        yield pool
    finally:
        await pool.stop()
