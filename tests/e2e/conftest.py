"""The end-to-end tests reuse the local-pool tests' small trace writer (``tests/integration/local``)."""

from __future__ import annotations

import sys
from pathlib import Path

LOCAL_TESTS = str(Path(__file__).resolve().parents[1] / "integration" / "local")
if LOCAL_TESTS not in sys.path:
    sys.path.append(LOCAL_TESTS)
