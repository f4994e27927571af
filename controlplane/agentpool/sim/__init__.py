"""agentpool.sim"""
