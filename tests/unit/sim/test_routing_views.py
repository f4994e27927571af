"""The simulator's router shell: incremental node views and shared prefix views equal fresh builds.

``NodeStates`` rebuilds only the states of the nodes the simulator touched, and ``prefixes``
shares the prompt's leading blocks and ``CachedPrefix`` views between nodes with equal prefixes.
Here every call of a real simulation (disaggregated with phase switches, and colocated) is checked
against a from-scratch build of the same values.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

import agentpool.sim.simulator as simulator_module
from agentpool.kv import Directory, Tier
from agentpool.kv.directory import Resolution
from agentpool.models import DecodeModel, NodeModel, PrefillModel, TtftSlo
from agentpool.node import Node, NodeStatus, Request, Role
from agentpool.router.policy import EMPTY_QUEUE, CachedPrefix, NodeState, QueuedPrefill
from agentpool.sim import routing
from agentpool.sim.metrics import Metrics
from agentpool.sim.presets import preset
from agentpool.sim.replay import Replay, WorkloadPeriod, cycle
from agentpool.sim.run import Scenario, load_conversations
from agentpool.sim.simulator import SimConfig, Simulator
from agentpool.sim.systems import system


def fresh_state(node: Node, model: NodeModel, queue: QueuedPrefill, now: float, waiting: int) -> NodeState:
    return NodeState(
        node_id=node.name,
        role=node.role,
        model=model,
        remaining_batch_s=node.remaining_batch_s(now),
        queue=queue,
        running_decode=len(node.running) + node.bound_waiting,  # bound during its prefill: counted
        kv_room_tokens=node.kv_room_tokens,
        kv_used_tokens=node.kv_used_tokens,
        accepting=node.status is NodeStatus.SERVING,
        draining=node.status is NodeStatus.DRAINING,
        report_age_s=0.0,
        decode_waiting_tokens=waiting,
    )


class CheckedStates(routing.NodeStates):
    """Compares every answer with fresh states, and counts the states reused from the last call."""

    def __init__(
        self,
        nodes: Sequence[Node],
        models: Sequence[NodeModel],
        queued: Sequence[QueuedPrefill] | None,
        *,
        prefill: bool,
        waiting_kv: Sequence[int] | None = None,
    ) -> None:
        super().__init__(nodes, models, queued, prefill=prefill, waiting_kv=waiting_kv)
        self.nodes, self.models, self.queued, self.waiting_kv = nodes, models, queued, waiting_kv
        self.prefill = prefill
        self.calls = 0
        self.reused = 0
        self.last: dict[str, NodeState] = {}

    def views(self, now: float) -> list[NodeState]:
        got = super().views(now)
        queued, waiting_kv = self.queued, self.waiting_kv
        wanted = [
            fresh_state(
                n,
                self.models[n.index],
                EMPTY_QUEUE if queued is None else queued[n.index],
                now,
                0 if waiting_kv is None else waiting_kv[n.index],
            )
            for n in self.nodes
            if n.status is NodeStatus.SERVING
            and (n.role in (Role.PREFILL, Role.BOTH) if self.prefill else n.role is Role.DECODE)
        ]
        assert got == wanted
        self.calls += 1
        self.reused += sum(1 for s in got if self.last.get(s.node_id) is s)
        self.last = {s.node_id: s for s in got}
        return got


checked: list[CheckedStates] = []
resolved: list[Resolution] = []


@pytest.fixture
def checking(monkeypatch: pytest.MonkeyPatch) -> None:
    checked.clear()

    def make(
        nodes: Sequence[Node],
        models: Sequence[NodeModel],
        queued: Sequence[QueuedPrefill] | None,
        *,
        prefill: bool,
        waiting_kv: Sequence[int] | None = None,
    ) -> CheckedStates:
        c = CheckedStates(nodes, models, queued, prefill=prefill, waiting_kv=waiting_kv)
        checked.append(c)
        return c

    real_resolve = Directory.resolve
    real_prefixes = routing.prefixes

    def resolve(self: Directory, hashes: Sequence[int], branch: str | None, now: float) -> Resolution:
        res = real_resolve(self, hashes, branch, now)
        resolved.append(res)
        return res

    def prefixes(
        directory: Directory,
        req: Request,
        nodes: Sequence[Node],
        index_of: dict[str, int],
        cap_blocks: int,
        block: int,
        branch: str | None,
        now: float,
    ) -> routing.Prefixes:
        got = real_prefixes(directory, req, nodes, index_of, cap_blocks, block, branch, now)
        res = resolved.pop()
        by_name = {n.name: n for n in nodes}
        blocks: dict[int, tuple[int, int]] = {}
        best = 0
        for name, match in res.prefixes.items():
            node = by_name.get(name)
            if node is None:
                continue
            local = min(match.local_blocks, cap_blocks)
            best = max(best, local)  # decode nodes count as peers to fetch from
            if node.role is not Role.DECODE:  # only prefill candidates get a per-node prefix
                gpu = min(node.gpu.prefix(req.blocks[:local]) if local else 0, local)
                blocks[node.index] = (gpu, local)
        assert got.blocks == blocks
        assert list(got.views) == [nodes[i].name for i in blocks]
        assert list(got.views.values()) == [
            CachedPrefix(gpu=g * block, total=t * block) for g, t in blocks.values()
        ]
        assert got.best_blocks == best
        return got

    monkeypatch.setattr(simulator_module, "NodeStates", make)
    monkeypatch.setattr(Directory, "resolve", resolve)
    monkeypatch.setattr(simulator_module, "prefixes", prefixes)


def run(
    system_name: str, nodes: int, prefill_nodes: int, until: float, switch_at: float | None = None
) -> Simulator:
    glm = preset("glm52-4xgb300")
    sc = Scenario(conversations=12, agents=12)
    convs = load_conversations(sc)
    assert convs is not None
    metrics = Metrics(TtftSlo(2.0, 1e-4), 0.1, 0.0, 10_000.0)
    sim = Simulator(system(system_name), glm, SimConfig(nodes=nodes, prefill_nodes=prefill_nodes), metrics)
    replay = Replay(sim, {"cc": cycle(convs)}, group=8)
    replay.closed_loop([WorkloadPeriod(0.0, {"cc": 12})])
    if switch_at is not None:
        sim.run(switch_at)
        sim.begin_switch(0, Role.DECODE)  # re-routes n0's queue while it drains
    sim.run(until)
    assert metrics.completed_total > 20
    return sim


@pytest.mark.usefixtures("checking")
def test_disaggregated_views_and_prefixes_equal_fresh_builds_across_a_phase_switch() -> None:
    sim = run("agentpool", 5, 3, 600.0, switch_at=200.0)
    assert any(sw["node"] == "n0" for sw in sim.metrics.switches)
    prefill, decode = checked
    assert prefill.calls > 20 and decode.calls > 20
    assert prefill.reused > 0 and decode.reused > 0  # the cache is exercised, not bypassed


@pytest.mark.usefixtures("checking")
def test_colocated_views_equal_fresh_builds() -> None:
    run("least-loaded", 3, 0, 400.0)
    prefill, decode = checked
    assert prefill.calls > 20 and prefill.reused > 0
    assert decode.calls == 0


def test_prefixes_per_node_with_different_gpu_parts() -> None:
    directory = Directory(page_size=64)
    nodes = [
        Node(
            i,
            f"n{i}",
            PrefillModel(c0=0.01, c1=5e-5, c2=1e-10, c3=1e-7),
            DecodeModel(d0=0.01, d1=0.005, d2=1e-4),
            role=Role.PREFILL,
            chunk_tokens=8192,
            t_acc=1.0,
            gpu_cache_blocks=100,
            kv_capacity_tokens=1 << 20,
        )
        for i in range(5)
    ]
    for n in nodes:
        directory.register_node(n.name, Role.PREFILL)
    path = list(range(1, 11))
    held = {"n0": 10, "n1": 10, "n2": 10, "n3": 4}  # n4 holds nothing
    on_gpu = {"n0": 10, "n1": 3, "n2": 3, "n3": 4}
    for name, count in held.items():
        directory.apply_stored(name, 0, path[:count], Tier.HOST, 0.0)
        nodes[int(name[1:])].gpu.touch(path[: on_gpu[name]])
    req = Request(1, 10 * 64, 10, path, [], "b", 0.0)
    found = routing.prefixes(directory, req, nodes, {n.name: n.index for n in nodes}, 9, 64, None, 0.0)
    assert found.blocks == {0: (9, 9), 1: (3, 9), 2: (3, 9), 3: (4, 4)}
    assert found.best_blocks == 9
    assert found.views == {
        "n0": CachedPrefix(gpu=576, total=576),
        "n1": CachedPrefix(gpu=192, total=576),
        "n2": CachedPrefix(gpu=192, total=576),
        "n3": CachedPrefix(gpu=256, total=256),
    }
    assert found.views["n1"] is found.views["n2"]  # equal prefixes share one view


def test_decode_nodes_count_for_the_cluster_prefix_but_get_no_view() -> None:
    directory = Directory(page_size=64)
    roles = [Role.PREFILL, Role.DECODE]
    nodes = [
        Node(
            i,
            f"n{i}",
            PrefillModel(c0=0.01, c1=5e-5, c2=1e-10, c3=1e-7),
            DecodeModel(d0=0.01, d1=0.005, d2=1e-4),
            role=role,
            chunk_tokens=8192,
            t_acc=1.0,
            gpu_cache_blocks=100,
            kv_capacity_tokens=1 << 20,
        )
        for i, role in enumerate(roles)
    ]
    directory.register_node("n0", Role.PREFILL)
    directory.register_node("n1", Role.DECODE)
    path = list(range(1, 11))
    directory.apply_stored("n0", 0, path[:3], Tier.HOST, 0.0)
    directory.apply_stored("n1", 0, path, Tier.HOST, 0.0)  # the decode node holds the whole prompt
    req = Request(1, 10 * 64, 10, path, [], "b", 0.0)
    found = routing.prefixes(directory, req, nodes, {n.name: n.index for n in nodes}, 9, 64, None, 0.0)
    assert found.blocks == {0: (0, 3)}
    assert set(found.views) == {"n0"}
    assert found.best_blocks == 9  # fetchable from the decode node, capped at 9
