"""Hash-sharded tables of the prefix index, and its walk over a request's blocks.

A Python dict grows by rebuilding its whole table at once when it passes two thirds of a power of two:
at a million entries one such rebuild holds the interpreter for tens of milliseconds (hundreds on a
loaded machine), and the event loop of the service with it. The index therefore keeps each of its big
tables as :data:`SHARDS` dicts, block hash ``h`` in dict ``h % SHARDS``: no single rebuild is larger
than a shard (a million blocks: about 16k entries each). The modulus is a prime so that hashes whose low
bits follow a pattern (e.g. always odd) still spread over every shard.

The price: a lookup first picks its shard (``h % SHARDS``, then the shard's bound ``get``); the index
keeps both holder sets of a block in one value so that a walk does one lookup per block, and walks cost
about what they did over unsharded tables (``bench/results/bench_directory.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import chain, islice, repeat
from operator import mod
from typing import TypeVar

SHARDS = 61
V = TypeVar("V")


def new_shards() -> list[dict[int, V]]:
    return [{} for _ in range(SHARDS)]


def shard_keys(hashes: Iterable[int]) -> list[int]:
    """The shard of each hash."""
    return list(map(mod, hashes, repeat(SHARDS)))


def total(tables: Iterable[Mapping[int, V]]) -> int:
    return sum(map(len, tables))


class ShardedAccess(Mapping[int, float]):
    """A node's sharded ``hash -> last access`` table as one read-only mapping, without a copy.
    Iteration goes shard by shard (not in insertion order)."""

    __slots__ = ("shards",)

    def __init__(self, shards: list[dict[int, float]]) -> None:
        self.shards = shards

    def __getitem__(self, h: int) -> float:
        return self.shards[h % SHARDS][h]

    def __contains__(self, h: object) -> bool:
        return isinstance(h, int) and h in self.shards[h % SHARDS]

    def __iter__(self) -> Iterator[int]:
        return chain.from_iterable(self.shards)

    def __len__(self) -> int:
        return total(self.shards)


def access_parts(access: Mapping[int, float]) -> Sequence[Mapping[int, float]]:
    """The plain tables behind ``access`` (its shards, or itself): C-level iteration over each."""
    return access.shards if isinstance(access, ShardedAccess) else (access,)


Depths = dict[int, int]  # slot -> blocks of its prefix
Gets = list[Callable[[int, int], int]]  # the bound ``get`` of each shard of a table

MIN_RUN = 8  # shortest run of blocks a walk remembers (see Runs)
MAX_RUNS = 1 << 16  # runs remembered at most (then all are forgotten)


class Runs:
    """Runs of blocks a walk found holding the very same holders int (``PrefixIndex._hold`` shares one
    int over a run of blocks whose holders it wrote together), so that the next walk of a prompt
    through them skips their lookups: ``skip[first block] = (blocks, last block, holders int)``. A
    run is used only where the prompt has its first and last block at the right distance: block
    hashes are chained (a hash names its whole prefix), so the blocks between are the run's. Every
    change of a block's holders reads the block's holders int first and calls :meth:`forget` with it,
    which drops every run of that int: a run in use has not changed since a walk saw it."""

    __slots__ = ("added", "of", "skip")

    def __init__(self) -> None:
        self.skip: dict[int, tuple[int, int, int]] = {}
        self.of: dict[int, list[int]] = {}  # id of a holders int -> first blocks of its runs
        self.added = 0  # runs added since the last clear (bounds ``of``)

    def forget(self, holders: int) -> None:
        """``holders`` (an int in the holders table) is being replaced at some block."""
        starts = self.of.pop(id(holders), None)
        if starts:
            skip = self.skip
            for b in starts:
                r = skip.get(b)
                if r is not None and r[2] is holders:
                    del skip[b]

    def add(self, first: int, blocks: int, last: int, holders: int) -> None:
        if self.added >= MAX_RUNS:
            self.skip.clear()
            self.of.clear()
            self.added = 0
        self.added += 1
        self.skip[first] = (blocks, last, holders)
        self.of.setdefault(id(holders), []).append(first)


def walk(hashes: Sequence[int], hold: Gets, live: int, runs: Runs) -> tuple[Depths, Depths, Depths]:
    """Per live node slot holding block 0 of ``hashes``: the length of its longest cached prefix in
    GPU memory, in host memory and in either (three ``slot -> blocks`` dicts; the first two list only
    nonzero lengths). ``hold``: the ``get`` of each shard of the ``block -> holders`` table (bit 2s: a
    host copy on slot s, bit 2s + 1: a GPU copy); ``live``: bit 2s for each live slot s. One lookup
    and one compare per block where the holders are those of the block before (most blocks of a
    shared prompt: no node can leave the prefix there), none for the blocks of a run the walk knows
    (:class:`Runs`; a walk remembers the runs of at least ``MIN_RUN`` blocks it went through). Where
    nodes leave, the walk only notes the leaving holder bits; they are turned into slots once, at the
    end (a prompt that 64 nodes leave one by one: 0.77x the time of recording each as it came)."""
    gpu_alive, host_alive, any_alive = live << 1, live, live  # the first block narrows them
    depth = 0
    prev = -1  # the previous block's holders (-1: none yet)
    start = 0  # where the holders became prev
    same = False  # whether every block since start has the very same holders int (a run to remember)
    skip = runs.skip
    n = len(hashes)
    left: list[tuple[int, int, int, int]] = []  # (depth, GPU, host, either): holder bits that left
    it = iter(hashes)
    for h in it:
        e = hold[h % SHARDS](h, 0)
        if e is prev:  # held where the previous block is: no node leaves. Runs of blocks with the
            depth += 1  # same holders share one int (PrefixIndex._hold): identity, not a read
            continue
        if e == prev:
            same = False
            depth += 1
            continue
        if same and depth - start >= MIN_RUN:
            known = skip.get(hashes[start])
            if known is None or known[0] < depth - start or known[2] is not prev:
                runs.add(hashes[start], depth - start, hashes[depth - 1], prev)
        prev = e
        g = gpu_alive & e
        s = host_alive & e
        a = any_alive & (e | (e >> 1))
        if depth:
            left.append((depth, gpu_alive & ~g, host_alive & ~s, any_alive & ~a))
        if not a:
            break
        gpu_alive, host_alive, any_alive = g, s, a
        start, same = depth, True
        run = skip.get(h)
        if run is not None and run[2] is e:
            blocks = run[0]
            end = depth + blocks
            if end <= n and hashes[end - 1] == run[1]:
                if blocks > 1:
                    next(islice(it, blocks - 2, None), None)  # past the run's other blocks
                depth = end
                continue
        depth += 1
    else:
        if same and depth - start >= MIN_RUN:
            known = skip.get(hashes[start])
            if known is None or known[0] < depth - start or known[2] is not prev:
                runs.add(hashes[start], depth - start, hashes[depth - 1], prev)
    if depth:
        left.append((depth, gpu_alive, host_alive, any_alive))
    # the bits as slots (bit 2s or 2s + 1: slot s), in the order they left, ascending within one
    # block; a mask has at most one of the two bits of a slot
    gpu_depth: Depths = {}
    host_depth: Depths = {}
    any_depth: Depths = {}
    for d, gm, sm, am in left:
        while gm:
            low = gm & -gm
            gpu_depth[(low.bit_length() - 1) >> 1] = d
            gm ^= low
        while sm:
            low = sm & -sm
            host_depth[(low.bit_length() - 1) >> 1] = d
            sm ^= low
        while am:
            low = am & -am
            any_depth[(low.bit_length() - 1) >> 1] = d
            am ^= low
    return gpu_depth, host_depth, any_depth
