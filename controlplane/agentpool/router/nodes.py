"""The router's view of its engine nodes: engine reports plus what the router itself sent.

Clock-free: callers pass ``now`` (seconds, any monotonic origin). One asyncio loop owns a table.

Per node the table keeps the latest :class:`LoadReport`, the prefill requests the router dispatched
and has not seen finish (each numbered with a per-node dispatch sequence), and the decode requests
it bound there. :meth:`NodeTable.snapshot` turns this into the policies' :class:`NodeState`:

- with a fresh report (at most ``max_report_age_s`` old): the reported batch and queue, plus the
  dispatches numbered after the report's ``last_dispatch_seq`` as "sent but not reported";
- with a stale or no report: every outstanding dispatch counts as "sent but not reported".

State is bounded: outstanding entries are removed when their request leaves the node, and the queue
limit caps how many a node gets.

Where nodes come from (``source``): ``config`` (the config file's list, applied by
:meth:`NodeTable.configure`), ``registry`` (an engine's report with its URL, :meth:`NodeTable.register`;
removed by :meth:`NodeTable.expire` after a time without reports) and ``kubernetes`` (EndpointSlices,
:meth:`NodeTable.sync`). Each source adds and removes only its own nodes; a configured id wins. A node
that fails requests gets nothing for ``down_cooldown_s``, doubled for each failure in a row up to
``max_down_s``, so a dead node is not retried every 2 s forever.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from agentpool.errors import ConflictError
from agentpool.models import DecodeModel, NodeModel, PrefillModel, Work
from agentpool.router.config import NodeConfig, NodeModelConfig
from agentpool.router.policy import EMPTY_QUEUE, NodeState, QueuedPrefill, Role
from agentpool.wire.engine import LoadReport


def node_model_of(cfg: NodeModelConfig) -> NodeModel:
    return NodeModel(
        prefill=PrefillModel(cfg.c0, cfg.c1, cfg.c2, cfg.c3),
        decode=DecodeModel(cfg.d0, cfg.d1, cfg.d2),
        t_bar=cfg.t_bar,
    )


@dataclass(slots=True)
class Dispatch:
    request_id: str
    seq: int
    work: Work
    kv_tokens: int


@dataclass(slots=True)
class _Sums:
    """Sums of queued prefill work (:class:`QueuedPrefill`'s fields) kept by adding and taking out.

    Exact for the router's work, whose token counts are whole numbers (so are the sums and the
    attention pairs, far below 2**53): the same floats as summing the queue afresh, in any order.
    Reset to zero whenever the queue empties, so no residue outlives a queue."""

    requests: int = 0
    t_uc: float = 0.0
    t_c: float = 0.0
    pairs: float = 0.0
    built: QueuedPrefill | None = None  # :meth:`queue`'s answer until the sums change

    def add(self, w: Work, sign: int) -> None:
        self.built = None
        self.requests += sign
        if self.requests == 0:
            self.t_uc = self.t_c = self.pairs = 0.0
            return
        self.t_uc += sign * w.t_uc
        self.t_c += sign * w.t_c
        self.pairs += sign * w.attention_pairs

    def queue(self) -> QueuedPrefill:
        if not self.requests:
            return EMPTY_QUEUE
        if self.built is None:
            self.built = QueuedPrefill(self.requests, self.t_uc, self.t_c, self.pairs)
        return self.built


@dataclass(slots=True)
class NodeEntry:
    config: NodeConfig
    role: Role
    model: NodeModel
    draining: bool = False
    report: LoadReport | None = None
    report_queue: QueuedPrefill = EMPTY_QUEUE
    report_at: float = 0.0
    t_acc: float = 1.0  # decode tokens per request and iteration, as the engine last reported
    down_until: float = float("-inf")
    failures: int = 0  # failed requests in a row
    source: str = "config"
    seen_at: float = 0.0  # registered or last reported
    awaiting_report: bool = False  # discovered without a role: nothing is sent until it reports
    # the configured role changed and no report has shown the engine taking it yet (a report of the
    # old role without a desired one is then stale news, not the engine's answer)
    config_switch: bool = False
    next_seq: int = 0
    # in dispatch order (sequence numbers increase), with running sums kept as they come and go:
    # the snapshot runs per request and node, and walking every queued request there made each
    # request's cost grow with the concurrency
    prefills: dict[str, Dispatch] = field(default_factory=dict)
    decodes: dict[str, Dispatch] = field(default_factory=dict)
    prefill_sums: _Sums = field(default_factory=lambda: _Sums())
    decode_kv: int = 0  # KV tokens of ``decodes``

    @property
    def node_id(self) -> str:
        return self.config.id

    @property
    def url(self) -> str:
        return self.config.url


# the order in which NodeTable._state passes NodeState's fields (a unit test checks it is theirs)
STATE_FIELDS = (
    "node_id",
    "role",
    "model",
    "remaining_batch_s",
    "queue",
    "unreported",
    "running_decode",
    "kv_room_tokens",
    "kv_used_tokens",
    "accepting",
    "draining",
    "report_age_s",
    "decode_waiting_tokens",
)

_NO_WORK = Work(t_uc=0.0)  # a decode's dispatch: its prefill work is not counted


class StaleFitsError(ConflictError):
    """A model set no newer than the one the router holds."""


class NodeTable:
    def __init__(
        self, max_report_age_s: float = 5.0, down_cooldown_s: float = 2.0, max_down_s: float = 60.0
    ) -> None:
        self.max_report_age_s = max_report_age_s
        self.down_cooldown_s = down_cooldown_s
        self.max_down_s = max_down_s
        self._nodes: dict[str, NodeEntry] = {}
        self._prior: NodeModel | None = None  # the configured nodeModel
        self._fitted: dict[str, NodeModel] = {}  # the planner's per-node fits (with t_bar, f_n)
        self.fits_version: int | None = None

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def get(self, node_id: str) -> NodeEntry:
        try:
            return self._nodes[node_id]
        except KeyError:
            raise KeyError(f"unknown node {node_id!r}") from None

    def entries(self) -> list[NodeEntry]:
        return list(self._nodes.values())

    # -- configuration -----------------------------------------------------------------------
    def configure(self, nodes: Iterable[NodeConfig], model: NodeModelConfig) -> list[str]:
        """Apply the configured node list; returns the ids whose desired role changed (now draining)."""
        seen: set[str] = set()
        switched: list[str] = []
        prior = self._prior = node_model_of(model)
        for cfg in nodes:
            seen.add(cfg.id)
            entry = self._nodes.get(cfg.id)
            node_model = self._fitted.get(cfg.id, prior)
            if entry is None or entry.source != "config":
                self._nodes[cfg.id] = NodeEntry(config=cfg, role=cfg.role, model=node_model)
                continue
            entry.config = cfg
            entry.model = node_model
            if cfg.role is not entry.role:
                entry.role = cfg.role
                entry.draining = True
                entry.config_switch = True
                switched.append(cfg.id)
        for gone in [i for i, e in self._nodes.items() if e.source == "config" and i not in seen]:
            del self._nodes[gone]
        return switched

    def apply_fits(self, version: int, models: Mapping[str, NodeModel]) -> list[str]:
        """Use the planner's fitted models from now on (each node its own; a node without one keeps
        the configured prior); returns the configured nodes they apply to. Raises
        :class:`StaleFitsError` unless ``version`` is newer than the set in use."""
        if self.fits_version is not None and version <= self.fits_version:
            raise StaleFitsError(f"model set {version} is not newer than {self.fits_version}")
        self._fitted = dict(models)
        self.fits_version = version
        for entry in self._nodes.values():
            prior = self._prior if self._prior is not None else entry.model
            entry.model = self._fitted.get(entry.node_id, prior)
        return sorted(n for n in self._fitted if n in self._nodes)

    def _model_for(self, node_id: str) -> NodeModel:
        prior = self._prior if self._prior is not None else node_model_of(NodeModelConfig())
        return self._fitted.get(node_id, prior)

    def fitted(self, node_id: str) -> bool:
        """Whether ``node_id`` uses a model the planner fitted (not the configured prior)."""
        return node_id in self._fitted

    # -- discovery ---------------------------------------------------------------------------
    def register(self, cfg: NodeConfig, source: str, now: float, *, awaiting_report: bool = False) -> bool:
        """Add a discovered node (or update its URL); ``False`` when the id is another source's."""
        entry = self._nodes.get(cfg.id)
        if entry is None:
            self._nodes[cfg.id] = NodeEntry(
                config=cfg,
                role=cfg.role,
                model=self._model_for(cfg.id),
                source=source,
                seen_at=now,
                awaiting_report=awaiting_report,
            )
            return True
        if entry.source != source:
            return False
        if entry.config.url != cfg.url:
            entry.config = entry.config.model_copy(update={"url": cfg.url})
        entry.seen_at = max(entry.seen_at, now)
        return True

    def sync(self, source: str, nodes: Iterable[NodeConfig], now: float) -> tuple[list[str], list[str]]:
        """Make ``source``'s nodes exactly ``nodes`` (roles come from their reports); (added, removed)."""
        wanted = {n.id: n for n in nodes}
        added = []
        for i, n in wanted.items():
            new = i not in self._nodes
            if self.register(n, source, now, awaiting_report=True) and new:
                added.append(i)
        removed = [i for i, e in self._nodes.items() if e.source == source and i not in wanted]
        for i in removed:
            del self._nodes[i]
        return added, removed

    def expire(self, source: str, now: float, ttl_s: float) -> list[str]:
        """Remove ``source``'s nodes neither registered nor heard from for ``ttl_s``; their ids."""
        gone = [i for i, e in self._nodes.items() if e.source == source and now - e.seen_at > ttl_s]
        for i in gone:
            del self._nodes[i]
        return gone

    def remove(self, node_id: str, source: str) -> bool:
        entry = self._nodes.get(node_id)
        if entry is None or entry.source != source:
            return False
        del self._nodes[node_id]
        return True

    # -- reports -----------------------------------------------------------------------------
    def apply_report(self, report: LoadReport, now: float) -> None:
        entry = self.get(report.node_id)
        entry.report = report
        entry.report_queue = QueuedPrefill.of(
            [Work(t_uc=float(q.t_uc), t_c=float(q.t_c)) for q in report.queue]
        )
        entry.report_at = now
        entry.seen_at = now
        if entry.awaiting_report:  # discovered without a role: the engine says which it serves
            entry.awaiting_report = False
            entry.role = report.role
        if report.t_acc is not None:
            entry.t_acc = report.t_acc
        if report.desired_role is not None:
            entry.config_switch = False
            if report.desired_role is not entry.role:
                entry.role = report.desired_role  # the planner switched the node: follow it at once
                entry.draining = True
        elif report.role is not entry.role and not entry.config_switch:
            # no switch pending on the engine, yet it serves another role: it switched between two
            # reports (an idle node drains at once) or back again; follow what it serves
            entry.role = report.role
            entry.draining = False
        if report.role is entry.role:
            entry.config_switch = False
            entry.draining = False  # the engine switched and says so

    # -- dispatch bookkeeping ----------------------------------------------------------------
    def dispatch_prefill(self, node_id: str, request_id: str, work: Work, kv_tokens: int) -> int:
        entry = self.get(node_id)
        seq = entry.next_seq
        entry.next_seq += 1
        old = entry.prefills.pop(request_id, None)
        if old is not None:  # dispatched there again: the old entry goes (the order stays by seq)
            entry.prefill_sums.add(old.work, -1)
        entry.prefills[request_id] = Dispatch(request_id, seq, work, kv_tokens)
        entry.prefill_sums.add(work, 1)
        return seq

    def finish_prefill(self, node_id: str, request_id: str) -> None:
        entry = self._nodes.get(node_id)
        if entry is not None:
            gone = entry.prefills.pop(request_id, None)
            if gone is not None:
                entry.prefill_sums.add(gone.work, -1)
            self._maybe_drained(entry)

    def bind_decode(self, node_id: str, request_id: str, kv_tokens: int) -> int:
        """Count a decode on the node; its dispatch sequence (-1: discovery removed the node)."""
        entry = self._nodes.get(node_id)
        if entry is None:
            return -1
        seq = entry.next_seq
        entry.next_seq += 1
        old = entry.decodes.pop(request_id, None)
        if old is not None:
            entry.decode_kv -= old.kv_tokens
        entry.decodes[request_id] = Dispatch(request_id, seq, _NO_WORK, kv_tokens)
        entry.decode_kv += kv_tokens
        return seq

    def t_acc(self, node_id: str) -> float:
        """The node's last reported decode tokens per iteration (1 when unknown or gone)."""
        entry = self._nodes.get(node_id)
        return 1.0 if entry is None else entry.t_acc

    def finish_decode(self, node_id: str, request_id: str) -> None:
        entry = self._nodes.get(node_id)
        if entry is not None:
            gone = entry.decodes.pop(request_id, None)
            if gone is not None:
                entry.decode_kv -= gone.kv_tokens
            self._maybe_drained(entry)

    def mark_down(self, node_id: str, now: float) -> float:
        """The node failed a request: send it nothing for a while (doubling); returns how long."""
        entry = self._nodes.get(node_id)
        if entry is None:
            return 0.0
        entry.failures += 1
        down_s = min(self.max_down_s, self.down_cooldown_s * 2.0 ** min(entry.failures - 1, 30))
        entry.down_until = now + down_s
        return down_s

    def succeeded(self, node_id: str) -> None:
        """A request finished on the node: its next failure starts the cool-down from the start."""
        entry = self._nodes.get(node_id)
        if entry is not None:
            entry.failures = 0

    def _maybe_drained(self, entry: NodeEntry) -> None:
        """Without reports the router ends the drain when it has nothing of its own left there."""
        if entry.draining and entry.report is None and not entry.prefills and not entry.decodes:
            entry.draining = False

    # -- views -------------------------------------------------------------------------------
    def snapshot(self, now: float) -> list[NodeState]:
        return [self._state(e, now) for e in self._nodes.values()]

    def _state(self, e: NodeEntry, now: float) -> NodeState:
        r = e.report
        age = None if r is None else max(0.0, now - e.report_at)
        fresh = age is not None and age <= self.max_report_age_s
        if r is not None and fresh:
            after = r.last_dispatch_seq
            queue = e.report_queue
            unreported = self._unreported(e, after)
            count, kv = self._decodes_after(e, after)
            running = r.running_decode + count
            room = max(0, r.kv_room_tokens - kv)
            used = r.kv_used_tokens
            waiting = r.decode_waiting_tokens
            remaining = r.remaining_batch_s
            accepting = r.accepting
        else:  # every dispatch and every decode counts (_unreported and _decodes_after of -1)
            queue = EMPTY_QUEUE
            unreported = e.prefill_sums.queue()
            running, used = len(e.decodes), e.decode_kv
            room = max(0, e.config.kv_capacity_tokens - used)
            waiting = 0
            remaining = 0.0
            accepting = True
        # positional, in NodeState's field order (STATE_FIELDS, tested): built per node for every
        # request, and keyword arguments cost twice as much (0.9 against 0.44 us)
        return NodeState(
            e.config.id,
            e.role,
            e.model,
            remaining,  # remaining_batch_s
            queue,
            unreported,
            running,  # running_decode
            room,  # kv_room_tokens
            used,  # kv_used_tokens
            accepting and now >= e.down_until and not e.awaiting_report,  # accepting
            e.draining,
            age,  # report_age_s
            waiting,  # decode_waiting_tokens
        )

    @staticmethod
    def _decodes_after(e: NodeEntry, after: int) -> tuple[int, int]:
        """How many decodes were bound after sequence ``after``, and their KV tokens: the running
        totals less the decodes numbered up to ``after`` (the first ones in order; usually none)."""
        count, kv = len(e.decodes), e.decode_kv
        if after >= 0:
            for d in e.decodes.values():
                if d.seq > after:
                    break
                count -= 1
                kv -= d.kv_tokens
        return count, kv

    @staticmethod
    def _unreported(e: NodeEntry, after: int) -> QueuedPrefill:
        """The prefills dispatched after sequence ``after``: the running sums less the prefills
        numbered up to ``after`` (the first ones in dispatch order, which the report covers)."""
        sums = e.prefill_sums
        if after < 0 or not e.prefills:
            return sums.queue()
        covered = [d.work for d in _up_to(e.prefills, after)]
        if not covered:
            return sums.queue()
        rest = _Sums(sums.requests, sums.t_uc, sums.t_c, sums.pairs)
        for w in covered:
            rest.add(w, -1)
        return rest.queue()


def _up_to(dispatches: dict[str, Dispatch], after: int) -> Iterable[Dispatch]:
    """The dispatches numbered up to ``after`` (a prefix of the dispatch order)."""
    for d in dispatches.values():
        if d.seq > after:
            return
        yield d
