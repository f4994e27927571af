"""agentpool.router"""
