"""Makes ``tests/`` importable, so that test directories share helpers (``process_helpers``), and
keeps the per-user token files (``agentpool.secret_file.local_tokens``) of every service the tests
start, in process or as a subprocess, in a folder of this run instead of the user's own."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from agentpool.secret_file.local_tokens import TOKEN_DIR_ENV

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.append(TESTS)

_TOKENS = tempfile.TemporaryDirectory(prefix="agentpool-test-tokens-")
os.environ[TOKEN_DIR_ENV] = str(Path(_TOKENS.name) / "tokens")
