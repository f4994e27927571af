"""The service shell without a network: codec, validation, batch sequencing, store-outage handling."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from agentpool.directory.client import encode_resolve_request
from agentpool.directory.convert import (
    InvalidRequestError,
    ResolveEncoder,
    block_list,
    branch_id,
    node_name,
    tier_from_pb,
)
from agentpool.directory.service import DirectoryService, ServiceTimers, grpc_status
from agentpool.directory.store import (
    MemoryBranchStore,
    RowTracker,
    Snapshot,
    StoreUnavailableError,
    decode_branch,
    encode_branch,
)
from agentpool.kv import BranchState, Directory, PendingMove, PrefixMatch, Role, Tier, UnknownBranchError
from agentpool.v1 import directory_pb2 as pb


def test_branch_row_round_trip() -> None:
    state = BranchState(
        "agent-1",
        version=3,
        path=(1, 2**64 - 1, 7),
        counted={"p1": frozenset({1, 7}), "d1": frozenset({2**64 - 1})},
        pending={"p1": PendingMove(3, 2)},
        last_seen=1234.5,
    )
    back = decode_branch("agent-1", encode_branch(state))
    assert back == state


@pytest.mark.parametrize("bad", ["", "-x", "a b", "x" * 300, "a{b}"])
def test_node_names_are_checked(bad: str) -> None:
    with pytest.raises(InvalidRequestError):
        node_name(bad)


def test_branch_block_and_tier_checks() -> None:
    assert branch_id("team/agent-1:fork.2@x") == "team/agent-1:fork.2@x"
    for bad in ("", "a{b}", "x" * 201):
        with pytest.raises(InvalidRequestError):
            branch_id(bad)
    with pytest.raises(InvalidRequestError, match="limit"):
        block_list([1] * 11, max_blocks=10)
    with pytest.raises(InvalidRequestError, match="root"):
        block_list([1, 0], max_blocks=10)
    with pytest.raises(InvalidRequestError):
        tier_from_pb(pb.TIER_UNSPECIFIED)
    assert tier_from_pb(pb.TIER_GPU_AND_HOST) == Tier.GPU | Tier.HOST


def _stored(node: str, seq: int, parent: int, hashes: list[int], tier: int = pb.TIER_GPU) -> pb.KvEventBatch:
    ev = pb.KvEvent(stored=pb.BlocksStored(parent_hash=parent, block_hashes=hashes, tier=tier))  # type: ignore[arg-type]
    return pb.KvEventBatch(node=node, seq=seq, events=[ev])


async def test_batch_sequencing() -> None:
    svc = DirectoryService(Directory(page_size=4), MemoryBranchStore())
    await svc.start()
    try:
        ack = await svc.apply_batch(_stored("n1", 1, 0, [5]))
        assert ack.resync_requested and "unknown" in ack.reason
        with pytest.raises(InvalidRequestError, match="phase"):
            await svc.apply_batch(pb.KvEventBatch(node="n1", seq=1, resync=pb.Resync()))
        ack = await svc.apply_batch(
            pb.KvEventBatch(node="n1", seq=10, phase=pb.PHASE_DECODE, resync=pb.Resync())
        )
        assert not ack.resync_requested and ack.seq == 10
        assert not (await svc.apply_batch(_stored("n1", 11, 0, [5, 6]))).resync_requested
        with pytest.raises(InvalidRequestError, match="tier"):
            await svc.apply_batch(_stored("n1", 12, 0, [7], tier=pb.TIER_UNSPECIFIED))
        hb = await svc.apply_batch(pb.KvEventBatch(node="n1", seq=11, heartbeat=True))
        assert not hb.resync_requested and hb.seq == 11
        ack = await svc.apply_batch(_stored("n1", 12, 99, [6]))  # 6 is known under parent 5
        assert ack.resync_requested and "inconsistent" in ack.reason
        assert (await svc.apply_batch(_stored("n1", 13, 5, [6]))).resync_requested  # until a resync
        assert svc.dir.index.longest_prefixes([5, 6])["n1"].gpu_blocks == 2
    finally:
        await svc.stop()


class FlakyStore(MemoryBranchStore):
    """Memory store whose writes and pings fail while ``down`` (our own persistence seam)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    async def save(self, *snaps: Snapshot) -> None:
        if self.down:
            raise StoreUnavailableError("down")
        await super().save(*snaps)

    async def ping(self) -> bool:
        return not self.down


async def test_failed_write_answers_unavailable_and_reloads_what_the_store_kept() -> None:
    store = FlakyStore()
    svc = DirectoryService(Directory(page_size=1), store, timers=ServiceTimers(store_check_interval_s=0.01))
    await svc.start()
    try:
        await svc._commit(svc.dir.register_node("p1", Role.PREFILL))
        res = svc.dir.resolve([1, 2], "a", 1.0)
        await svc._commit(res.changes)
        store.down = True
        res = svc.dir.resolve([9], "a", 2.0)  # compaction, applied in memory, not persisted
        with pytest.raises(StoreUnavailableError) as err:
            await svc._commit(res.changes)
        assert grpc_status(err.value) is grpc.StatusCode.UNAVAILABLE and not svc.store_ok
        with pytest.raises(StoreUnavailableError):
            svc._require_store()
        store.down = False
        for _ in range(200):
            await asyncio.sleep(0.01)
            if svc.store_ok:
                break
        assert svc.store_ok
        state = svc.dir.branches.get("a")
        assert (state.version, state.path) == (1, (1, 2))  # what the store kept
    finally:
        await svc.stop()


async def test_resolve_writes_nothing_each_place_is_one_write() -> None:
    store = MemoryBranchStore()
    svc = DirectoryService(Directory(page_size=1), store, timers=ServiceTimers(sweep_interval_s=3600))
    await svc.start()
    try:
        await svc._commit(svc.dir.register_node("p1", Role.PREFILL))
        await svc._commit(svc.dir.register_node("d1", Role.DECODE))
        w0 = store.writes
        out = pb.ResolveResponse.FromString(
            await svc._resolve(pb.ResolveRequest(block_hashes=[1, 2], branch="a"))
        )
        assert out.branch.is_new and out.branch.version == 1
        assert store.writes == w0 and "a" not in svc.dir.branches  # read-only
        placed = await svc._place(pb.PlaceRequest(branch="a", node="p1", block_hashes=[1, 2]))
        assert placed.is_new and store.writes == w0 + 1  # E.1 and E.2 in one write
        await svc._place(pb.PlaceRequest(branch="a", node="d1", block_hashes=[1, 2]))
        assert store.writes == w0 + 2
        row = decode_branch("a", store.rows["a"])
        assert (row.version, row.path, set(row.counted)) == (1, (1, 2), {"p1", "d1"})
    finally:
        await svc.stop()


async def test_a_rejected_request_leaves_the_branch_as_it_was() -> None:
    """A compaction resolved but never placed (every engine answered 429): version, path and counts
    stay; the request placed later bumps once and releases the dropped history."""
    store = MemoryBranchStore()
    svc = DirectoryService(Directory(page_size=1), store, timers=ServiceTimers(sweep_interval_s=3600))
    await svc.start()
    try:
        await svc._commit(svc.dir.register_node("p1", Role.PREFILL))
        await svc._place(pb.PlaceRequest(branch="a", node="p1", block_hashes=[1, 2, 3]))
        for _ in range(2):
            raw = await svc._resolve(pb.ResolveRequest(block_hashes=[1, 9], branch="a"))  # compaction
            out = pb.ResolveResponse.FromString(raw)
            assert out.branch.version == 2 and out.branch.version_bumped
            assert svc.dir.branches.get("a").version == 1 and svc.dir.count("p1", 3) == 1
        placed = await svc._place(pb.PlaceRequest(branch="a", node="p1", block_hashes=[1, 9]))
        assert placed.version == 2 and placed.version_bumped and svc.dir.count("p1", 3) == 0
        row = decode_branch("a", store.rows["a"])
        assert (row.version, row.path, row.counted["p1"]) == (2, (1, 9), frozenset({1, 9}))
    finally:
        await svc.stop()


async def test_place_without_hashes_needs_a_known_branch() -> None:
    svc = DirectoryService(Directory(page_size=1), MemoryBranchStore())
    await svc.start()
    try:
        await svc._commit(svc.dir.register_node("p1", Role.PREFILL))
        with pytest.raises(UnknownBranchError) as err:
            await svc._place(pb.PlaceRequest(branch="a", node="p1"))
        assert grpc_status(err.value) is grpc.StatusCode.NOT_FOUND
        placed = await svc._place(pb.PlaceRequest(branch="a", node="zz", block_hashes=[1]))
        assert placed.is_new and not placed.node_known and placed.counted_nodes == []  # E.1 only
        assert svc.dir.branches.get("a").path == (1,)
    finally:
        await svc.stop()


def test_row_tracker_writes_only_changed_fields() -> None:
    d = Directory(page_size=1)
    d.register_node("p1", Role.PREFILL)
    d.register_node("d1", Role.DECODE)
    rows = RowTracker()
    first = d.resolve([1, 2, 3], "a", 1.0).changes
    first.merge(d.place("a", "p1", 1.0))
    snap = rows.snapshot(d, first)
    assert set(snap.branches) == {"a"} and not snap.patches  # a new row is written whole
    snap = rows.snapshot(d, d.place("a", "d1", 2.0))
    assert not snap.branches
    put, drop = snap.patches["a"]
    assert set(put) == {b"v", b"s", b"c:d1"} and drop == ()  # not the path, not c:p1
    d.resolve([7], "a", 3.0)  # compaction: every counted set and the path change
    snap = rows.snapshot(d, d.place("a", "p1", 3.0))
    put, drop = snap.patches["a"]
    assert set(put) == {b"v", b"s", b"p", b"c:p1"} and drop == (b"c:d1",)


async def test_a_failed_write_makes_queued_diffs_whole_rows() -> None:
    store = FlakyStore()
    svc = DirectoryService(Directory(page_size=1), store, timers=ServiceTimers(store_check_interval_s=3600))
    await svc.start()
    try:
        await svc._commit(svc.dir.register_node("p1", Role.PREFILL))
        await svc._commit(svc.dir.resolve([1, 2], "a", 1.0).changes)
        store.down = True
        with pytest.raises(StoreUnavailableError):
            await svc._commit(svc.dir.place("a", "p1", 2.0))
        store.down = False
        store.rows.clear()  # what a patch would now land on: nothing of the row
        await svc._commit(svc.dir.place("a", "p1", 3.0), strict=False)
        assert decode_branch("a", store.rows["a"]).counted == {"p1": frozenset({1, 2})}  # whole row
    finally:
        await svc.stop()


class CancelSwallowingStore(MemoryBranchStore):
    """A ping that loses the cancellation it receives, as Python 3.11's ``asyncio.wait_for`` inside
    redis-py's socket timeouts can when the cancel arrives as the call completes."""

    def __init__(self) -> None:
        super().__init__()
        self.pinging = asyncio.Event()
        self.swallowed = 0

    async def ping(self) -> bool:
        if self.swallowed:  # once is enough: a second cancel ends the loop, so a regression fails, not hangs
            return True
        self.pinging.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.swallowed += 1
        return True


async def test_stop_ends_the_sweeps_even_when_a_store_call_swallows_the_cancel() -> None:
    store = CancelSwallowingStore()
    svc = DirectoryService(Directory(page_size=1), store, timers=ServiceTimers(store_check_interval_s=0.0))
    await svc.start()
    await asyncio.wait_for(store.pinging.wait(), 5)
    await asyncio.wait_for(svc.stop(), 5)  # hung before: the monitor looped on after losing its cancel
    assert store.swallowed == 1


class CountingStore(MemoryBranchStore):
    def __init__(self) -> None:
        super().__init__()
        self.pings = 0

    async def ping(self) -> bool:
        self.pings += 1
        return True


async def test_a_service_started_again_after_stop_runs_its_sweeps_again() -> None:
    store = CountingStore()
    svc = DirectoryService(Directory(page_size=1), store, timers=ServiceTimers(store_check_interval_s=0.0))
    for _ in range(2):
        await svc.start()
        before = store.pings
        for _ in range(100):
            await asyncio.sleep(0.01)
            if store.pings > before:
                break
        await svc.stop()
        assert store.pings > before


@pytest.mark.parametrize("hashes", [[], [1], [2**64 - 1, 5, 1 << 40] * 700])
@pytest.mark.parametrize("branch", ["", "agent/1"])
def test_the_hand_built_resolve_request_is_the_protobuf_encoding(hashes: list[int], branch: str) -> None:
    raw = encode_resolve_request(hashes, branch, omit_paths=bool(branch))
    assert pb.ResolveRequest.FromString(raw) == pb.ResolveRequest(
        block_hashes=hashes, branch=branch, omit_paths=bool(branch)
    )
    with pytest.raises(ValueError, match="unsigned 64-bit"):
        encode_resolve_request([-1], branch)


def test_resolve_answers_are_cached_entry_encodings_that_parse_as_one_message() -> None:
    enc = ResolveEncoder(page_size=4, cache_size=2)
    m1, m2 = PrefixMatch(1, 2, 2), PrefixMatch(0, 3, 3)
    phases = {"a": Role.PREFILL, "b": Role.DECODE}
    info = pb.BranchInfo(branch="x", version=3)
    for _ in range(2):  # the second time from the cache (and once more after it was cleared)
        out = pb.ResolveResponse.FromString(enc.encode({"b": m2, "a": m1, "c": m1}, phases, info))
        assert [n.node for n in out.nodes] == ["a", "b", "c"]
        assert (out.nodes[0].gpu_tokens, out.nodes[0].local_tokens, out.nodes[0].phase) == (
            4,
            8,
            pb.PHASE_PREFILL,
        )
        assert out.nodes[2].phase == pb.PHASE_UNSPECIFIED and out.page_size == 4 and out.branch.version == 3
    assert pb.ResolveResponse.FromString(enc.encode({}, phases, None)) == pb.ResolveResponse(page_size=4)


class GatedStore(MemoryBranchStore):
    """Saves wait until ``gate`` opens; records how many snapshots each save carried."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.sizes: list[int] = []

    async def save(self, *snaps: Snapshot) -> None:
        await self.gate.wait()
        self.sizes.append(len(snaps))
        await super().save(*snaps)


async def test_writes_queued_together_share_one_save_in_order_and_survive_a_cancelled_caller() -> None:
    store = GatedStore()
    svc = DirectoryService(Directory(page_size=1), store, timers=ServiceTimers(store_check_interval_s=3600))
    store.gate.set()
    await svc.start()
    try:
        await svc._commit(svc.dir.register_node("p1", Role.PREFILL))
        store.gate.clear()
        store.sizes.clear()
        first = asyncio.create_task(svc._commit(svc.dir.resolve([1], "a", 1.0).changes))
        await asyncio.sleep(0)  # the flusher takes the first write and waits at the gate
        later = [
            asyncio.create_task(svc._commit(svc.dir.resolve([1, 2 + i], "a", 2.0 + i).changes))
            for i in range(3)
        ]
        await asyncio.sleep(0)
        later[1].cancel()  # its caller goes away: the write still lands
        store.gate.set()
        await asyncio.gather(first, later[0], later[2])
        assert store.sizes == [1, 3]  # the three queued behind the first went out together
        row = decode_branch("a", store.rows["a"])
        assert row.path == (1, 4) and row.version == svc.dir.branches.get("a").version  # the last
    finally:
        await svc.stop()


async def test_route_places_answer_after_their_writes_and_quiet_ones_only_when_they_failed() -> None:
    """The Route session settles each Place from its write's outcome (a callback, not a task): a
    quiet Place is answered only when its write failed, a waited-for one always; the store's state
    and the directory's gauges (read when scraped) follow."""
    from agentpool.directory import framing
    from agentpool.directory.route import RouteSession

    store = FlakyStore()
    svc = DirectoryService(Directory(page_size=1), store, timers=ServiceTimers(store_check_interval_s=60))
    await svc.start()
    session = RouteSession(svc)
    try:
        await svc._commit(svc.dir.register_node("p1", Role.PREFILL))
        place = framing.place_request
        session.apply(
            pb.RouteBatch.FromString(
                framing.route_op(1, place=place("a", "p1", [1, 2]), quiet=True)
                + framing.route_op(2, place=place("b", "p1", [1, 3]))
            ).ops
        )
        replies = pb.RouteReplies.FromString(await session.next_replies() or b"").replies
        assert [(r.id, r.WhichOneof("result")) for r in replies] == [(2, "place")]  # the quiet one: silent
        assert replies[0].place.is_new and set(store.rows) == {"a", "b"}
        sample = svc.metrics.registry.get_sample_value
        assert (sample("agentpool_directory_branches"), sample("agentpool_directory_nodes")) == (2.0, 1.0)
        assert sample("agentpool_directory_index_blocks") == 0.0  # no engine stored a block

        store.down = True
        session.apply(
            pb.RouteBatch.FromString(framing.route_op(3, place=place("c", "p1", [4]), quiet=True)).ops
        )
        replies = pb.RouteReplies.FromString(await session.next_replies() or b"").replies
        assert [(r.id, r.WhichOneof("result")) for r in replies] == [(3, "error")]
        assert replies[0].error.code == grpc.StatusCode.UNAVAILABLE.value[0] and "c" not in store.rows
        assert not session._writes  # every write settled
    finally:
        await session.close()
        await svc.stop()
