"""Wire formats shared by the control-plane services (pydantic, at the edges; no I/O here).

- :mod:`agentpool.wire.work`: what routers serve the planner (``GET /agentpool/v1/work``):
  per-request work records, occupancy samples and the engines' iteration records.
- :mod:`agentpool.wire.iterations`: one engine iteration as engines report it (inside their load
  reports to the routers) and as routers pass it on to the planner.
- :mod:`agentpool.wire.engine`: the router/engine protocol: dispatch (``GenerateRequest``), the
  engine's event stream (``EngineEvent``) and the engines' load reports to the routers (``LoadReport``).
- :mod:`agentpool.wire.fits`: the planner's fitted per-node models that it pushes to every router
  (``PUT /agentpool/v1/models``), versioned.
- :mod:`agentpool.wire.urls`: a pod's or endpoint's base URL from its address.

Neutral on purpose: the planner, the routers and the engines import these modules; none of them
owns the format.
"""
