"""Pure planner core (evolving-infra §5.2, Algorithm E.3 outer loop): no I/O, no clock."""
