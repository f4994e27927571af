"""The ``sglang`` backend's parts: launch arguments, the KV-event bridge, the role-switch driver.

SGLang itself needs GPUs; on CPU machines these parts are tested against stand-ins that speak its HTTP
endpoints and ZMQ frames (see ``engine-image/README.md`` for what is verified and what is not).
"""
