"""agentpool.router.policy"""
