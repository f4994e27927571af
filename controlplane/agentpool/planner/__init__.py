"""agentpool.planner"""
