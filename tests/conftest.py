"""Makes ``tests/`` importable, so that test directories share helpers (``process_helpers``)."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.append(TESTS)
