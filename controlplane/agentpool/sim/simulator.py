"""The discrete-event loop: a heap of timed events over nodes, router, directory, planner and replay.

Deterministic for a seed: events at equal times run in the order they were scheduled, the replay's
random draws come from one seeded generator, and no wall clock is read.

Request path (disaggregated pool): issue -> directory resolve (E.1) -> policy picks the prefill
node -> the branch is placed there (E.2) -> fetch from a peer (async: overlaps the queue; sync: the
prefill iteration waits) -> chunked prefill -> the node stores the prompt's blocks (GPU cache, host
tier via a KV event to the directory) -> decode binding (KV room, fewest running) -> P->D hand-over
-> decode -> the decode node stores the prompt and the output's blocks -> the replay issues the
requests that waited for this one. Colocated pools decode on the prefill node.
"""

from __future__ import annotations

import functools
import heapq
import math
import operator
from collections import deque
from collections.abc import Callable
from typing import cast

import numpy as np

from agentpool.kv import ROOT_HASH, Directory, Tier
from agentpool.kv.eviction import eviction_hashes_counted
from agentpool.models import NodeModel, OccupancySample, RequestWorkRecord, Work
from agentpool.node import IterationHook, Node, Request, Role
from agentpool.node.timing import EquationTimes, IterationTimes, NoisyTimes
from agentpool.router.policy import (
    EMPTY_QUEUE,
    NoCandidateError,
    PolicyContext,
    QueuedPrefill,
    create_policy,
    kv_room_needed,
)
from agentpool.router.policy.contract import prefill_candidates
from agentpool.sim.config import DECODE_BINDINGS, TRUTHS, SimConfig
from agentpool.sim.events import CALL, ISSUE, JOIN, NET, SWITCH_DONE, TICK, WAKE, Issue, WindowLog
from agentpool.sim.metrics import Metrics
from agentpool.sim.network import Network, Transfers
from agentpool.sim.presets import Preset
from agentpool.sim.routing import (
    NodeStates,
    choose_decode,
    fetchable_blocks,
    prefixes,
    request_view,
)
from agentpool.sim.switching import PhaseSwitches, split_of
from agentpool.sim.systems import Eviction, FetchMode, Pool, SystemConfig

_UNLIMITED_BLOCKS = 1 << 40
_KV_ROOM = operator.attrgetter("kv_room_tokens")
__all__ = ["DECODE_BINDINGS", "TRUTHS", "Issue", "SimConfig", "Simulator", "WindowLog"]


class Simulator:
    """``on_iteration``, when given, receives every node's iteration records (see ``Iteration``)."""

    def __init__(
        self,
        system: SystemConfig,
        preset: Preset,
        cfg: SimConfig,
        metrics: Metrics,
        *,
        on_iteration: IterationHook | None = None,
        seed: int = 0,
    ) -> None:
        self.system = system
        self.preset = preset
        self.cfg = cfg
        self.metrics = metrics
        self.now = 0.0
        self._events: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self.policy = create_policy(system.policy, dict(system.policy_knobs))
        self.ctx = PolicyContext(
            slo=metrics.slo,
            tpot_slo_s=metrics.tpot_slo_s,
            max_queue_per_node=1 << 30,
            page_size=cfg.block_size,
        )
        self.directory = Directory(page_size=cfg.block_size)
        unlimited = system.unlimited_cache
        block = cfg.block_size
        host_tokens = preset.host_kv_tokens if cfg.host_kv_tokens is None else cfg.host_kv_tokens
        self.host_cap_blocks = _UNLIMITED_BLOCKS if unlimited else host_tokens // block
        gpu_blocks = _UNLIMITED_BLOCKS if unlimited else preset.gpu_kv_tokens // block
        self.nodes: list[Node] = []
        # the ground truth, noiseless (what fitted models are checked against), and its noise
        self.truth: IterationTimes = (
            preset.roofline()
            if cfg.truth == "roofline"
            else EquationTimes(preset.prefill_model(), preset.decode_model())
        )
        noise = preset.truth.noise if cfg.noise is None else cfg.noise
        for i in range(cfg.nodes):
            timing: IterationTimes = self.truth
            if noise > 0:
                timing = NoisyTimes(timing, noise, np.random.default_rng([seed, i]))
            if system.pool is Pool.COLOCATED:
                role = Role.BOTH
            else:
                role = Role.PREFILL if i < cfg.prefill_nodes else Role.DECODE
            node = Node(
                i,
                f"n{i}",
                preset.prefill_model(),
                preset.decode_model(),
                role=role,
                chunk_tokens=preset.chunk_tokens,
                t_acc=preset.t_acc,
                gpu_cache_blocks=gpu_blocks,
                kv_capacity_tokens=preset.gpu_kv_tokens,
                on_iteration=on_iteration,
                timing=timing,
                shared_kv_block_tokens=block if cfg.shared_gpu_memory and not unlimited else None,
            )
            self.nodes.append(node)
            self.directory.register_node(node.name, role)
        base_model = cfg.starting_model(
            NodeModel(preset.prefill_model(), preset.decode_model(), t_bar=float(preset.chunk_tokens))
        )
        self.models: list[NodeModel] = [base_model for _ in self.nodes]
        self.queued: list[QueuedPrefill] = [EMPTY_QUEUE for _ in self.nodes]  # per node, prefill not started
        self._local_waiting_kv = [0] * len(self.nodes)  # per node, KV tokens of prefilled requests
        # waiting for local decode room (colocated); below, the policy's views of the nodes:
        # _changed(node) after anything that may change one
        self._prefill_states = NodeStates(
            self.nodes, self.models, self.queued, prefill=True, waiting_kv=self._local_waiting_kv
        )
        self._decode_states = NodeStates(self.nodes, self.models, None, prefill=False)
        self._node_index = {n.name: n.index for n in self.nodes}
        self._wake_version = [0] * len(self.nodes)
        self._pending_decode: deque[tuple[Request, Issue]] = deque()
        self._pending_least_kv = 0  # no waiting request needs less KV room than this
        self._local_decode: dict[int, deque[Request]] = {}  # colocated: prefilled, waiting for KV room
        self._issues: dict[int, Issue] = {}
        self.switches = PhaseSwitches(self)
        self.window = WindowLog()
        self.in_decode = 0
        self.fetch = self.ctx.fetch
        binding = system.decode_binding or cfg.decode_binding
        if binding not in DECODE_BINDINGS:
            raise ValueError(f"decode binding must be one of {DECODE_BINDINGS}, got {binding!r}")
        self._bind_at_start = binding == "prefill-start"
        self._bind_early = binding != "prefill-end"  # bound before the first token: hand over at once
        self._bind_at_dispatch = binding == "dispatch" and system.pool is Pool.DISAGGREGATED
        # dispatch binding: requests with no decode KV room yet, waiting before the prefill queue
        self._admission: deque[Issue] = deque()
        self.transfers = (
            Transfers(
                Network(preset.pd_transfer_bytes_per_s, preset.host_link_bytes_per_s),
                lambda at, version: self.schedule(at, NET, version),
            )
            if cfg.network
            else None
        )
        self._fetching: dict[int, int] = {}  # request id -> its fetch's transfer id
        metrics.record_split(0.0, self.split())

    # -- node views -------------------------------------------------------------------------------
    def _changed(self, index: int) -> None:
        """Node ``index``'s state, queued sums or model may have changed: its views are rebuilt."""
        self._prefill_states.touch(index)
        self._decode_states.touch(index)

    def set_model(self, index: int, model: NodeModel) -> None:
        """The model the router (and planner) use for node ``index`` from now on."""
        self.models[index] = model
        self._changed(index)

    # -- event plumbing ---------------------------------------------------------------------------
    def schedule(self, at: float, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._events, (at, self._seq, kind, payload))

    def issue_at(self, at: float, issue: Issue) -> None:
        """Send ``issue`` at ``at``; a request no node's GPU KV holds would stall its node forever."""
        if (need := issue.req.kv_tokens) > self.preset.gpu_kv_tokens:
            raise ValueError(f"a request needs {need} tokens of KV, more than a node holds (cap_context)")
        self.schedule(at, ISSUE, issue)

    def every(self, period_s: float, first_at: float, fn: Callable[[float], None]) -> None:
        """Call ``fn(now)`` every ``period_s`` from ``first_at`` on."""
        self.schedule(first_at, TICK, (period_s, fn))

    def call_at(self, at: float, fn: Callable[[float], None]) -> None:
        """Call ``fn(now)`` once at ``at``."""
        self.schedule(at, CALL, fn)

    def _wake(self, node: Node) -> None:
        t = node.wake_time()
        self._wake_version[node.index] += 1
        if t < math.inf:
            self.schedule(max(t, self.now), WAKE, (node.index, self._wake_version[node.index]))

    def run(self, until: float) -> None:
        self.every(self.cfg.occupancy_sample_s, 0.0, self._sample)
        events = self._events
        while events and events[0][0] < until:
            at, _, kind, payload = heapq.heappop(events)
            self.now = at
            if kind == WAKE:
                idx, version = cast(tuple[int, int], payload)
                if version == self._wake_version[idx]:
                    self._on_wake(self.nodes[idx])
            elif kind == ISSUE:
                self._route(cast(Issue, payload))
            elif kind == JOIN:
                target, req = cast(tuple[int, Request], payload)
                self._on_join(target, req)
            elif kind == SWITCH_DONE:
                self.switches.done(cast(int, payload))
            elif kind == CALL:
                cast(Callable[[float], None], payload)(at)
            elif kind == NET:
                assert self.transfers is not None
                self.transfers.on_event(payload, at, self.call_at)
            else:
                period, fn = cast(tuple[float, Callable[[float], None]], payload)
                fn(at)
                self.schedule(at + period, TICK, payload)
        self.now = until

    # -- routing ----------------------------------------------------------------------------------
    def _route(self, issue: Issue) -> None:
        req, now, block = issue.req, self.now, self.cfg.block_size
        if self._bind_at_dispatch and req.decode_node < 0 and req.output_tokens > 1:
            target = choose_decode(req, self.ctx, now, self._decode_states, self._node_index)
            if target is None:  # no decode room: wait before the prefill queue (SGLang's prealloc)
                self._admission.append(issue)
                return
            self._reserve(req, target)
        cap = max(0, (req.input_tokens - 1) // block)
        branch = req.branch if self.system.branch_ids else None
        found = prefixes(self.directory, req, self.nodes, self._node_index, cap, block, branch, now)
        per_node, cluster = found.blocks, found.best_blocks
        ideal = self.metrics.ideal_prefix(req.blocks, cap)
        visible = cluster * block if self.system.fetch is not FetchMode.NONE else 0
        view = request_view(
            req, issue.turn, issue.new_turn_tokens, found.views, visible, self.system.router_sees_branch
        )
        states = self._prefill_states.views(now)
        candidates = prefill_candidates(states, self.ctx)
        try:
            decision = self.policy.choose(view, candidates, self.ctx)
        except NoCandidateError:
            self.schedule(now + 1.0, ISSUE, issue)  # every prefill node is switching: retry
            return
        idx = self._node_index[decision.node_id]
        node = self.nodes[idx]
        gpu, have = per_node.get(idx, (0, 0))
        fetch_blocks = fetchable_blocks(self.system.fetch, self.fetch, cluster - have, block)
        req.cached_tokens = (have + fetch_blocks) * block
        req.fetch_tokens = fetch_blocks * block
        req.restore_tokens = (have - gpu + fetch_blocks) * block
        req.ideal_cached_tokens = ideal * block
        req.prefill_node = idx
        tau = (
            self.fetch.tau(req.fetch_tokens)
            if self.system.fetch in (FetchMode.ASYNC, FetchMode.SYNC)
            else 0.0
        )
        req.fetch_ready_at = now + tau if self.system.fetch is FetchMode.ASYNC else now
        req.sync_fetch_s = tau if self.system.fetch is FetchMode.SYNC else 0.0
        self._fetching.pop(req.rid, None)
        if tau and self.transfers is not None and self.system.fetch is FetchMode.ASYNC:
            req.fetch_ready_at = math.inf  # ready when the bytes are through
            nbytes = req.fetch_tokens * self.preset.kv_bytes_per_token
            done = functools.partial(self._fetched, req, idx)
            tid = self.transfers.start(found.best_node, idx, nbytes, now, self.fetch.base_s, done, host=True)
            self._fetching[req.rid] = tid
        if branch is not None:
            self.directory.place(branch, node.name, now)
        self._issues[req.rid] = issue
        self.window.works.append(
            RequestWorkRecord(
                now,
                Work(
                    t_uc=float(req.uncached_tokens),
                    t_c=float(req.cached_tokens),
                    t_out=float(max(1, req.output_tokens - 1)),
                    t_acc=self.preset.t_acc,
                ),
            )
        )
        self.queued[idx] = self.queued[idx].with_request(req.uncached_tokens, req.cached_tokens)
        node.submit(req, now)
        self._changed(idx)
        self._after_step(node)

    # -- node events ------------------------------------------------------------------------------
    def _on_wake(self, node: Node) -> None:
        out = node.advance(self.now)
        self._changed(node.index)
        if out.iteration is not None:
            self.window.iterations.setdefault(node.index, []).append(out.iteration[1])
        for r in out.prefilled:
            self._on_prefilled(node, r)
        for r in out.decoded:
            self._on_decoded(node, r)
        if out.decoded:
            if node.role is Role.BOTH:
                self._admit_local(node)
            else:
                self._retry_pending_decode()
        self._after_step(node)

    def _after_step(self, node: Node) -> None:
        if node.started:  # requests whose first chunk started leave the queued sums
            bind = self._bind_at_start and node.role is Role.PREFILL
            for r in node.started:
                self.queued[node.index] = self.queued[node.index].with_request(
                    r.uncached_tokens, r.cached_tokens, -1
                )
                self._changed(node.index)
                if bind and r.output_tokens > 1:
                    self._bind_decode(r, self._issues[r.rid])
            node.started.clear()
        self._wake(node)
        sw = self.switches.active.get(node.index)
        if sw is not None and sw.drained_at < 0 and node.drained:
            self.switches.drained(node, sw)

    def _store(self, node: Node, blocks: list[int], parent: int) -> None:
        if not blocks:
            return
        self.directory.apply_stored(node.name, parent, blocks, Tier.HOST, self.now)
        node.gpu.touch(blocks)
        count = self.directory.index.node_block_count(node.name)
        if count > self.host_cap_blocks:
            self._evict_host(node, count - int(self.host_cap_blocks * (1 - self.cfg.host_evict_fraction)))

    def _evict_host(self, node: Node, n: int) -> None:
        if self.system.eviction is Eviction.BRANCH_COUNT:
            hashes, _ = self.directory.evict_host(node.name, n)
        else:
            hashes = eviction_hashes_counted(self.directory.index.host_access(node.name), {}, limit=n)
            self.directory.apply_removed(node.name, hashes, Tier.HOST)
        node.gpu.discard(hashes)
        self.metrics.evicted_blocks += len(hashes)

    def _on_prefilled(self, node: Node, req: Request) -> None:
        full = req.blocks
        self._store(node, full, ROOT_HASH)
        self.metrics.first_token(req, req.ideal_cached_tokens // self.cfg.block_size)
        issue = self._issues[req.rid]
        if req.output_tokens <= 1:
            req.done_at = req.first_token_at
            self._complete(req, issue)
            return
        if node.role is Role.BOTH:
            self._local_decode.setdefault(node.index, deque()).append(req)
            self._local_waiting_kv[node.index] += req.kv_tokens
            self._changed(node.index)
            self._admit_local(node)
            return
        if not self._bind_early:
            self._bind_decode(req, issue)
        elif req.decode_node >= 0:  # bound at dispatch or prefill start: the KV goes there now
            self._hand_over(req, was_waiting=True)
        # else: still waiting for decode room; the retry that binds it hands the KV over

    def _admit_local(self, node: Node) -> None:
        """Colocated nodes decode their own prefills, first come first served, while KV room lasts."""
        waiting = self._local_decode.get(node.index)
        while waiting and (waiting[0].kv_tokens <= node.kv_room_tokens or not node.running):
            req = waiting.popleft()
            self._local_waiting_kv[node.index] -= req.kv_tokens
            node.join_decode(req, self.now)
            self._changed(node.index)
            self.in_decode += 1

    def _bind_decode(self, req: Request, issue: Issue) -> None:
        target = choose_decode(req, self.ctx, self.now, self._decode_states, self._node_index)
        if target is None:
            self._wait_for_decode(req, issue)
            return
        self._reserve(req, target)
        if req.first_token_at < 0:  # bound before its prefill ended: the hand-over waits for it
            return
        self._hand_over(req, was_waiting=False)

    def _reserve(self, req: Request, target: int) -> None:
        dnode = self.nodes[target]
        req.decode_node = target
        dnode.reserve_decode(req)  # KV room held from now on; bound and waiting if not prefilled yet
        self._changed(target)
        if self.system.branch_ids:
            self.directory.place(req.branch, dnode.name, self.now)

    def _hand_over(self, req: Request, *, was_waiting: bool) -> None:
        """Send the prefilled KV to the bound decode node (GPU to GPU), which starts decoding on arrival.
        Until it arrives the node counts it as joining: a drain of the node waits for it."""
        self.nodes[req.decode_node].handover_started(req, was_waiting=was_waiting)
        self._changed(req.decode_node)
        if self.transfers is None:
            self.schedule(self.now + self.preset.handover_s(req.input_tokens), JOIN, (req.decode_node, req))
            return
        nbytes = req.input_tokens * self.preset.kv_bytes_per_token
        join = functools.partial(self._on_join, req.decode_node, req)
        self.transfers.start(
            req.prefill_node, req.decode_node, nbytes, self.now, 0.0, lambda _tid, _at: join(), host=False
        )

    def _fetched(self, req: Request, node: int, tid: int, at: float) -> None:
        """A queued request's prefix arrived; ignored if the request was re-routed since."""
        if self._fetching.get(req.rid) != tid or req.prefill_node != node:
            return
        del self._fetching[req.rid]
        req.fetch_ready_at = at
        self._wake(self.nodes[node])

    def _retry_pending_decode(self) -> None:
        """Bind the prefilled requests waiting for decode KV room, oldest first, as room allows.

        A request binds only if some serving decode node has room for its KV (``bind_decode``'s
        filter), so one that needs more than the largest room keeps waiting without a binding
        attempt, and nothing is tried while the largest room is below every waiting request's
        need: under decode pressure thousands wait, and each completion would otherwise retry every
        one of them against every decode node. Then the dispatch-bound requests waiting for room
        before their prefill queue are dispatched, first come first served, while room lasts."""
        self._retry_prefilled()
        while self._admission:
            head = self._admission[0].req
            if kv_room_needed(head.input_tokens, head.output_tokens) > self._largest_decode_room():
                return
            self._route(self._admission.popleft())

    @property
    def admission_waiting(self) -> int:
        """Requests waiting for decode KV room before their prefill is queued (dispatch binding)."""
        return len(self._admission)

    def _retry_prefilled(self) -> None:
        if not self._pending_decode:
            return
        room = self._largest_decode_room()
        if room < self._pending_least_kv:
            return
        pending, self._pending_decode = self._pending_decode, deque()
        for req, issue in pending:
            if kv_room_needed(req.input_tokens, req.output_tokens) > room:
                self._wait_for_decode(req, issue)
                continue
            self._bind_decode(req, issue)
            room = self._largest_decode_room()

    def _wait_for_decode(self, req: Request, issue: Issue) -> None:
        need = kv_room_needed(req.input_tokens, req.output_tokens)  # bind_decode's filter
        if not self._pending_decode or need < self._pending_least_kv:
            self._pending_least_kv = need
        self._pending_decode.append((req, issue))

    def _largest_decode_room(self) -> int:
        """The most KV room of a serving decode node (-1: none), from the decode views."""
        return max(map(_KV_ROOM, self._decode_states.views(self.now)), default=-1)

    def _on_join(self, target: int, req: Request) -> None:
        dnode = self.nodes[target]
        self._store(dnode, req.blocks, ROOT_HASH)
        dnode.handover_arrived(req, self.now)
        self._changed(target)
        self.in_decode += 1
        self._after_step(dnode)

    def _on_decoded(self, node: Node, req: Request) -> None:
        self.in_decode -= 1
        if req.produced:
            parent = req.blocks[-1] if req.blocks else ROOT_HASH
            self._store(node, req.produced, parent)
        self._complete(req, self._issues[req.rid])

    def _complete(self, req: Request, issue: Issue) -> None:
        del self._issues[req.rid]
        self.metrics.ideal_add(req.produced)
        self.metrics.done(req)
        if issue.last_of_branch and self.system.branch_ids:
            self.directory.end_branch(req.branch)
        issue.on_done(req, self.now)

    # -- occupancy ----------------------------------------------------------------------------
    def _sample(self, now: float) -> None:
        q = len(self._issues) if self.cfg.occupancy == "inflight" else self.in_decode
        self.window.occupancy.append(OccupancySample(now, float(q)))

    # -- phase switches (agentpool.sim.switching) ---------------------------------------------
    def split(self) -> tuple[int, int, int]:
        """(prefill, decode, out of service) counts by current role."""
        return split_of(self.nodes)

    @property
    def switching(self) -> bool:
        return bool(self.switches.active)

    @property
    def last_switch_at(self) -> float | None:
        """When the last switch was decided (``None``: never)."""
        return self.switches.last_at

    def begin_switch(self, index: int, to: Role) -> None:
        self.switches.begin(index, to)
