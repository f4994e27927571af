"""Branch table with versions (Algorithm E.1 of the evolving-infra paper).

A branch is one agent context and its sequence of requests. The table keeps, per branch, its version
``v``, the path ``pi`` (block hashes) of its last request, the blocks it counts on each node
(``C[node]``, Algorithm E.2) and, for same-phase moves, the nodes whose placement still waits for the
target to hold the branch's current version. Pure: the caller passes ``now``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from agentpool.errors import InvalidInputError
from agentpool.kv.types import KvError, UnknownBranchError

BRANCH_ID_RE = re.compile(r"^[A-Za-z0-9._:/@-]{1,200}$")


class InvalidBranchIdError(KvError, InvalidInputError):
    """A branch id is empty, too long or has characters outside ``[A-Za-z0-9._:/@-]``."""


def check_branch_id(branch: str) -> str:
    if not BRANCH_ID_RE.match(branch):
        raise InvalidBranchIdError(f"branch id {branch[:40]!r} must be 1-200 characters of [A-Za-z0-9._:/@-]")
    return branch


@dataclass(frozen=True, slots=True)
class PendingMove:
    """A placement on a node that releases the branch's other same-phase copies once the node holds
    the first ``blocks`` blocks of the branch's path at ``version``."""

    version: int
    blocks: int


@dataclass(slots=True)
class BranchState:
    """One row of the branch table: everything about a branch that must survive a directory restart."""

    branch_id: str
    version: int = 1
    path: tuple[int, ...] = ()
    counted: dict[str, frozenset[int]] = field(default_factory=dict)  # C[node], only non-empty sets
    pending: dict[str, PendingMove] = field(default_factory=dict)  # target node -> move
    last_seen: float = 0.0

    @property
    def nodes(self) -> frozenset[str]:
        """``N_beta``: the nodes where the branch holds counts."""
        return frozenset(self.counted)


@dataclass(frozen=True, slots=True)
class Observation:
    """Output of Algorithm E.1 for one request of a branch."""

    version: int
    old_path: tuple[int, ...]
    new_path: tuple[int, ...]
    is_new: bool
    version_bumped: bool


def is_prefix(old: Sequence[int], new: Sequence[int]) -> bool:
    return len(old) <= len(new) and tuple(new[: len(old)]) == tuple(old)


class BranchTable:
    """``S`` of Algorithm E.1: branch id -> :class:`BranchState`."""

    def __init__(self) -> None:
        self._rows: dict[str, BranchState] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, branch: object) -> bool:
        return branch in self._rows

    def ids(self) -> list[str]:
        return list(self._rows)

    def get(self, branch: str) -> BranchState:
        try:
            return self._rows[branch]
        except KeyError:
            raise UnknownBranchError(f"branch {branch!r} is not in the branch table") from None

    def find(self, branch: str) -> BranchState | None:
        return self._rows.get(branch)

    def put(self, state: BranchState) -> None:
        self._rows[state.branch_id] = state

    def remove(self, branch: str) -> BranchState:
        state = self.get(branch)
        del self._rows[branch]
        return state

    def observe(self, branch: str, new_path: Sequence[int], now: float) -> Observation:
        """Algorithm E.1: a request of ``branch`` whose full pages hash to ``new_path``."""
        obs = self.preview(branch, new_path)
        state = self._rows.get(branch)
        if state is None:
            self._rows[branch] = BranchState(branch, version=1, path=obs.new_path, last_seen=now)
            return obs
        state.version = obs.version
        if obs.new_path != state.path:  # an unchanged path keeps its object (a row writer skips it)
            state.path = obs.new_path
        state.last_seen = now
        return obs

    def preview(self, branch: str, new_path: Sequence[int]) -> Observation:
        """What :meth:`observe` would answer, changing nothing (a lookup before the request is placed)."""
        state = self._rows.get(branch)
        new = tuple(new_path)
        if state is None:
            check_branch_id(branch)
            return Observation(1, (), new, is_new=True, version_bumped=False)
        old = state.path
        bumped = not is_prefix(old, new)
        version = state.version + 1 if bumped else state.version
        return Observation(version, old, new, is_new=False, version_bumped=bumped)

    def idle_since(self, cutoff: float) -> list[str]:
        """Branches not seen since before ``cutoff``."""
        return [b for b, s in self._rows.items() if s.last_seen < cutoff]
