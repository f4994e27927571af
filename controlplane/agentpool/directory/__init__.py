"""agentpool.directory"""
