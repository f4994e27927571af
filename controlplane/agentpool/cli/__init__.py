"""The ``agentpool`` command line. Subcommands register themselves in :data:`SUBCOMMANDS`."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

# name -> (help, add-arguments function, run function returning an exit code)
Subcommand = tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]


def _subcommands() -> dict[str, Subcommand]:
    """The explicit registry of subcommands (imported lazily so `--help` stays fast)."""
    from agentpool.cli import demo, replay, simulate, up

    return {
        "simulate": (simulate.HELP, simulate.add_arguments, simulate.run),
        "replay": (replay.HELP, replay.add_arguments, replay.run),
        "up": (up.HELP, up.add_arguments, up.run),
        "demo": (demo.HELP, demo.add_arguments, demo.run),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentpool", description="agentpool: serve LLM agents on GPU pools")
    sub = parser.add_subparsers(dest="command", required=True)
    commands = _subcommands()
    for name, (help_text, add_arguments, _run) in commands.items():
        add_arguments(sub.add_parser(name, help=help_text, description=help_text))
    args = parser.parse_args(argv)
    return commands[args.command][2](args)


if __name__ == "__main__":
    raise SystemExit(main())
