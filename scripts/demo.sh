#!/usr/bin/env bash
# agentpool on one machine, from a fresh clone: installs what the demo needs, then runs
# `agentpool demo` (a local pool of sim engines + a live replay of the bundled Claude Code sample;
# about 4-5 minutes on 2 cores). Arguments go to `agentpool demo` (see `agentpool demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1

echo "== installing agentpool (pip install -e .)"
python3 -m pip install -q -e .
# NIXL for the engines' host KV pool: its PyPI metapackage asks for CUDA wheels that CPU machines
# lack; without its dependencies it imports and moves DRAM between processes with UCX.
echo "== installing NIXL (CPU: --no-deps nixl nixl-cu12)"
python3 -m pip install -q --no-deps nixl==1.5.1 nixl-cu12==1.5.1

if ! command -v redis-server >/dev/null; then
  echo "== installing redis-server"
  if command -v apt-get >/dev/null; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq redis-server
  elif command -v brew >/dev/null; then
    brew install redis
  else
    echo "redis-server is not installed and neither apt-get nor brew is available: install Redis 6+" >&2
    exit 1
  fi
fi

echo "== agentpool demo $*"
exec python3 -m agentpool.cli demo "$@"
