"""The local-pool tests reuse the router tests' stand-in engine (``tests/integration/router``)."""

from __future__ import annotations

import sys
from pathlib import Path

ROUTER_TESTS = str(Path(__file__).resolve().parents[1] / "router")
if ROUTER_TESTS not in sys.path:
    sys.path.append(ROUTER_TESTS)
