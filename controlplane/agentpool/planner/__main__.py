"""Run the planner: ``python -m agentpool.planner --pool NAME --router URL [...]``.

See ``python -m agentpool.planner --help`` and :mod:`agentpool.planner.process`.
"""

from agentpool.planner.process import main

if __name__ == "__main__":
    raise SystemExit(main())
