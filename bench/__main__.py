"""Run the benchmarks: ``python -m bench [NAME ...]`` (names: the ``bench_<name>.py`` modules here).

Each benchmark is its own module runnable as ``python -m bench.bench_<name>``; this runs the chosen ones
(all by default) one after another in subprocesses and fails if any fails.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def available() -> list[str]:
    return sorted(p.stem.removeprefix("bench_") for p in HERE.glob("bench_*.py"))


def main(argv: list[str]) -> int:
    names = argv or available()
    unknown = sorted(set(names) - set(available()))
    if unknown:
        print(f"unknown benchmarks {unknown}; available: {available()}", file=sys.stderr)
        return 2
    failed: list[str] = []
    for name in names:
        print(f"\n=== bench {name}", flush=True)
        rc = subprocess.run([sys.executable, "-m", f"bench.bench_{name}"], cwd=HERE.parent).returncode
        if rc != 0:
            failed.append(name)
    if failed:
        print(f"\nfailed: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
