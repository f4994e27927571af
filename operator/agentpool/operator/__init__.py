"""The kopf operator for AgentServingPool: handlers, pure manifest builders, status."""
