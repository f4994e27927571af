"""The router's dispatch body built from fields is the model's encoding, byte for byte."""

from __future__ import annotations

import orjson

from agentpool.wire.engine import GenerateRequest, KvSource, encode_generate, generate_body


def test_generate_body_is_the_models_encoding() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi \u00e9"}], "max_tokens": 3}
    for kv in (None, KvSource(node_id="p0", url="http://p0:8000", transfer_id="t-1")):
        model = GenerateRequest(
            request_id="chatcmpl-1",
            dispatch_seq=4,
            phase="decode" if kv else "both",
            endpoint="chat",
            body=body,
            prompt_token_ids=[1, 2, 3],
            cached_tokens=2,
            fetch_tokens=1,
            kv_source=kv,
            router_id="r1",
        )
        args = ("chatcmpl-1", 4, "decode" if kv else "both", "chat", body, [1, 2, 3], 2, 1)
        kv_source = None if kv is None else kv.model_dump()
        fields = generate_body(*args, kv_source, "r1")
        assert fields == encode_generate(model)
        spliced = generate_body(*args, kv_source, "r1", prompt_token_ids_json=b"[1,2,3]")
        assert spliced == fields
        assert GenerateRequest.model_validate(orjson.loads(fields)) == model
