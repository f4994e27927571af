"""agentpool.sim: discrete-event simulator and trace replay that compares agentpool with baselines.

Modules:

- :mod:`agentpool.node` (a pure core of its own, also driven in real time by the engine's ``sim``
  backend): the node model (chunked prefill, decode batches, mixed colocated iterations, GPU
  cache), driven here in virtual time. :mod:`.node` keeps its old names for compatibility.
- :mod:`.simulator`: the event loop: router shell, directory, KV events, decode binding, P->D
  hand-over, fetches; :mod:`.switching`: its phase switches (drain, downtime, new role);
  :mod:`.events`: its event kinds and records.
- :mod:`.routing`: policy views (``RequestView``, ``NodeState``) built from simulated state.
- :mod:`.systems`: the compared systems, each a configuration of the same plugins.
- :mod:`.planners`: agentpool's planner (the pure planner core) and the dynamo-/arrow-like and
  oracle planners.
- :mod:`.trace`, :mod:`.synthetic`, :mod:`.replay`: workloads and closed/open-loop replay.
- :mod:`.metrics`, :mod:`.report`, :mod:`.run`, :mod:`.cli`: measurements, reports, ``agentpool simulate``.
- :mod:`.presets`: node calibration presets (``data/presets.json``); :mod:`.config`: ``SimConfig``;
  :mod:`.network`: shared links for fetches and hand-overs; :mod:`.fiterror`: fitted models
  against the ground truth.

Shared pure code driven here: :class:`agentpool.kv.Directory` (prefix index, branch table E.1,
branch counts E.2, eviction order), the routing policies of :mod:`agentpool.router.policy` and
their decode binding, :func:`agentpool.planner.core.plan` with :mod:`agentpool.models` (Eq. 1-5,
window slices, ``t_bar``/``f_n`` remeasurement) and the fetch model ``tau(x)`` of
:mod:`agentpool.models.fetch` (0.45 ms + 1 us/token from 512 tokens: App. D.6's measurements; the
0.45 s constant of App. E.3 is read as a unit slip, see that module).

Modelling choices and approximations (each a knob or documented where it is made):

- KV blocks of 512 tokens by default (eight 64-token trace blocks keyed by the last one's chained
  id): prefixes match at 512-token granularity, so up to 511 tokens of a reusable prefix are
  recomputed (under 1% of a typical 100K-token Claude Code prompt). ``--block-tokens 64`` is exact
  and about 8x slower.
- One GPU KV memory per node (``--gpu-memory shared``, default): the prefix cache holds what
  running and reserved decode requests leave of ``gpu_kv_tokens``, so growing decode batches evict
  cached prefixes (LRU); ``separate`` gives each its own pool, as the former simulator did. The
  host tier has its own size (``--host-kv-tokens``, default the preset's).
- Network (:mod:`.network`, ``SimConfig.network``): async fetches from a peer's host pool and P->D
  hand-overs share per-node NIC and host-memory bandwidth (processor sharing); a fetch's request
  waits in the queue until its bytes are through. Synchronous fetches (``dynamo-like+pool``) keep
  their uncontended time, added to the iteration that waits for them.
- The host tier is the directory's index (every stored block is written through to host memory);
  the GPU tier is the node's own LRU. Host eviction runs in batches of 25% of the capacity, in the
  directory's order: ``(R > 0, last access)`` with branch ids, the same function with all counts 0
  (LRU) without.
- The decode node is bound when the prefill starts, as Algorithm E.3 (line 13) and the live router
  do: the request holds its decode KV room and counts as running there during its prefill.
  ``SimConfig.decode_binding = "prefill-end"`` (``--decode-binding``) binds it when the first token
  is out instead. The SGLang PD baselines (static-cache-aware, dynamo-like) bind at dispatch
  (``SystemConfig.decode_binding = "dispatch"``): the decode node reserves the request's KV before
  its prefill is queued, and a request that finds no decode room waits before the prefill queue
  (SGLang's pre-allocation; evolving-infra App. D.1). Either way its KV room is reserved from
  binding to the end of the request.
- A queued request's prefix is not pinned: if eviction removes it before the prefill, the request
  keeps the work computed at routing time.
- Ground truth: every node's iterations take what :class:`agentpool.node.roofline.Roofline` says
  for the preset's architecture and GPUs (``--truth roofline``, default; calibrated against the
  papers' figures, see ``bench/results/sim_truth.md``), times ``1 + noise * N(0, 1)`` (never
  below ``1 - 4 noise``) drawn from a generator seeded by ``(seed, node)``. ``--truth equations``
  runs Eq. 1/2 with the preset's coefficients instead (the former simulator: the policies then
  face no model error).
- Agentpool's planner and router fit Eq. 1/2 online (``--fit online``, default) from the first
  window's iterations, and report the fit's error against the truth; until then, and throughout
  with ``--fit preset``, they use the preset's coefficients (the paper's fit). ``t_bar`` and
  ``f_n`` are remeasured from simulated iterations every window.
- Seeds: ``--seed`` draws the order in which conversations are replayed (a fresh order per pass
  over the trace), the iteration noise, the synthetic workloads and open-loop arrivals.
- Bounds and references (:mod:`.bounds`): every closed-loop trace run reports its own upper
  bound (``bound_rps``: from its replay's state at the window's start, every later request at the
  ground truth's minimal response time, no queueing), and the ideal replay's rate in the window
  from time 0 as a reference; ``static-reference`` is the hindsight best static
  split (every split swept, unlimited shared cache, free fetches, no switches) and
  ``oracle-reference`` Eq. 5's best split per past window: references, not bounds.
- Arrow-like switches strand KV: the switched node's cache is dropped. Dynamo-like relaunches:
  the node drains, is out of service for ``relaunch_s`` and loses its KV.
- Replay may cap recorded pauses (``max_pause_s``) to reach the paper's offered load.
"""
