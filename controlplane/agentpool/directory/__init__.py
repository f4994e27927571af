"""KV directory service: gRPC shell (service, handlers, ingest), Redis and memory stores, asyncio client.

See README.md in this package for the RPC semantics, the Redis key layout and the failure behaviour.
"""
