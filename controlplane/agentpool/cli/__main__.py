"""``python -m agentpool.cli``: same as the ``agentpool`` command."""

from agentpool.cli import main

raise SystemExit(main())
