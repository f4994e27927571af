"""agentpool.api"""
