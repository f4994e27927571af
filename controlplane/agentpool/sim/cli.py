"""`agentpool simulate` (being built under issue 6)."""

from __future__ import annotations

import argparse

HELP = "simulate agentpool and baseline systems on an agent trace"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser


def run(args: argparse.Namespace) -> int:
    del args
    raise SystemExit("agentpool simulate is not built yet")
