"""The engine agent: backends (sglang, sim), role switch, host KV pool, KV events."""
