from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIER_UNSPECIFIED: _ClassVar[Tier]
    TIER_GPU: _ClassVar[Tier]
    TIER_HOST: _ClassVar[Tier]
    TIER_GPU_AND_HOST: _ClassVar[Tier]

class Phase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PHASE_UNSPECIFIED: _ClassVar[Phase]
    PHASE_PREFILL: _ClassVar[Phase]
    PHASE_DECODE: _ClassVar[Phase]
    PHASE_BOTH: _ClassVar[Phase]
TIER_UNSPECIFIED: Tier
TIER_GPU: Tier
TIER_HOST: Tier
TIER_GPU_AND_HOST: Tier
PHASE_UNSPECIFIED: Phase
PHASE_PREFILL: Phase
PHASE_DECODE: Phase
PHASE_BOTH: Phase

class BlocksStored(_message.Message):
    __slots__ = ("parent_hash", "block_hashes", "tier")
    PARENT_HASH_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    parent_hash: int
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    tier: Tier
    def __init__(self, parent_hash: _Optional[int] = ..., block_hashes: _Optional[_Iterable[int]] = ..., tier: _Optional[_Union[Tier, str]] = ...) -> None: ...

class BlocksRemoved(_message.Message):
    __slots__ = ("block_hashes", "tier")
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    tier: Tier
    def __init__(self, block_hashes: _Optional[_Iterable[int]] = ..., tier: _Optional[_Union[Tier, str]] = ...) -> None: ...

class KvEvent(_message.Message):
    __slots__ = ("stored", "removed")
    STORED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    stored: BlocksStored
    removed: BlocksRemoved
    def __init__(self, stored: _Optional[_Union[BlocksStored, _Mapping]] = ..., removed: _Optional[_Union[BlocksRemoved, _Mapping]] = ...) -> None: ...

class HeldBlock(_message.Message):
    __slots__ = ("block_hash", "parent_hash", "tiers")
    BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    PARENT_HASH_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    block_hash: int
    parent_hash: int
    tiers: Tier
    def __init__(self, block_hash: _Optional[int] = ..., parent_hash: _Optional[int] = ..., tiers: _Optional[_Union[Tier, str]] = ...) -> None: ...

class Resync(_message.Message):
    __slots__ = ("blocks", "block_hashes", "parent_hashes", "tiers")
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    PARENT_HASHES_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    blocks: _containers.RepeatedCompositeFieldContainer[HeldBlock]
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    parent_hashes: _containers.RepeatedScalarFieldContainer[int]
    tiers: bytes
    def __init__(self, blocks: _Optional[_Iterable[_Union[HeldBlock, _Mapping]]] = ..., block_hashes: _Optional[_Iterable[int]] = ..., parent_hashes: _Optional[_Iterable[int]] = ..., tiers: _Optional[bytes] = ...) -> None: ...

class KvEventBatch(_message.Message):
    __slots__ = ("node", "seq", "events", "resync", "phase", "heartbeat")
    NODE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    RESYNC_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    node: str
    seq: int
    events: _containers.RepeatedCompositeFieldContainer[KvEvent]
    resync: Resync
    phase: Phase
    heartbeat: bool
    def __init__(self, node: _Optional[str] = ..., seq: _Optional[int] = ..., events: _Optional[_Iterable[_Union[KvEvent, _Mapping]]] = ..., resync: _Optional[_Union[Resync, _Mapping]] = ..., phase: _Optional[_Union[Phase, str]] = ..., heartbeat: _Optional[bool] = ...) -> None: ...

class PublishAck(_message.Message):
    __slots__ = ("node", "seq", "resync_requested", "reason")
    NODE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    RESYNC_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    node: str
    seq: int
    resync_requested: bool
    reason: str
    def __init__(self, node: _Optional[str] = ..., seq: _Optional[int] = ..., resync_requested: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class ResolveRequest(_message.Message):
    __slots__ = ("block_hashes", "branch", "omit_paths")
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    OMIT_PATHS_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    branch: str
    omit_paths: bool
    def __init__(self, block_hashes: _Optional[_Iterable[int]] = ..., branch: _Optional[str] = ..., omit_paths: _Optional[bool] = ...) -> None: ...

class NodePrefix(_message.Message):
    __slots__ = ("node", "phase", "gpu_blocks", "host_blocks", "local_blocks", "gpu_tokens", "host_tokens", "local_tokens")
    NODE_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    GPU_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    HOST_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    GPU_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HOST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    node: str
    phase: Phase
    gpu_blocks: int
    host_blocks: int
    local_blocks: int
    gpu_tokens: int
    host_tokens: int
    local_tokens: int
    def __init__(self, node: _Optional[str] = ..., phase: _Optional[_Union[Phase, str]] = ..., gpu_blocks: _Optional[int] = ..., host_blocks: _Optional[int] = ..., local_blocks: _Optional[int] = ..., gpu_tokens: _Optional[int] = ..., host_tokens: _Optional[int] = ..., local_tokens: _Optional[int] = ...) -> None: ...

class BranchInfo(_message.Message):
    __slots__ = ("branch", "version", "is_new", "version_bumped", "previous_path", "new_path", "counted_nodes")
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    IS_NEW_FIELD_NUMBER: _ClassVar[int]
    VERSION_BUMPED_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_PATH_FIELD_NUMBER: _ClassVar[int]
    NEW_PATH_FIELD_NUMBER: _ClassVar[int]
    COUNTED_NODES_FIELD_NUMBER: _ClassVar[int]
    branch: str
    version: int
    is_new: bool
    version_bumped: bool
    previous_path: _containers.RepeatedScalarFieldContainer[int]
    new_path: _containers.RepeatedScalarFieldContainer[int]
    counted_nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, branch: _Optional[str] = ..., version: _Optional[int] = ..., is_new: _Optional[bool] = ..., version_bumped: _Optional[bool] = ..., previous_path: _Optional[_Iterable[int]] = ..., new_path: _Optional[_Iterable[int]] = ..., counted_nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class ResolveResponse(_message.Message):
    __slots__ = ("nodes", "branch", "page_size")
    NODES_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodePrefix]
    branch: BranchInfo
    page_size: int
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodePrefix, _Mapping]]] = ..., branch: _Optional[_Union[BranchInfo, _Mapping]] = ..., page_size: _Optional[int] = ...) -> None: ...

class PlaceRequest(_message.Message):
    __slots__ = ("branch", "node", "block_hashes")
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    branch: str
    node: str
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, branch: _Optional[str] = ..., node: _Optional[str] = ..., block_hashes: _Optional[_Iterable[int]] = ...) -> None: ...

class PlaceResponse(_message.Message):
    __slots__ = ("version", "counted_blocks", "counted_nodes", "move_pending", "is_new", "version_bumped", "node_known")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    COUNTED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    COUNTED_NODES_FIELD_NUMBER: _ClassVar[int]
    MOVE_PENDING_FIELD_NUMBER: _ClassVar[int]
    IS_NEW_FIELD_NUMBER: _ClassVar[int]
    VERSION_BUMPED_FIELD_NUMBER: _ClassVar[int]
    NODE_KNOWN_FIELD_NUMBER: _ClassVar[int]
    version: int
    counted_blocks: int
    counted_nodes: _containers.RepeatedScalarFieldContainer[str]
    move_pending: bool
    is_new: bool
    version_bumped: bool
    node_known: bool
    def __init__(self, version: _Optional[int] = ..., counted_blocks: _Optional[int] = ..., counted_nodes: _Optional[_Iterable[str]] = ..., move_pending: _Optional[bool] = ..., is_new: _Optional[bool] = ..., version_bumped: _Optional[bool] = ..., node_known: _Optional[bool] = ...) -> None: ...

class RouteOp(_message.Message):
    __slots__ = ("id", "resolve", "place", "end_branch", "quiet")
    ID_FIELD_NUMBER: _ClassVar[int]
    RESOLVE_FIELD_NUMBER: _ClassVar[int]
    PLACE_FIELD_NUMBER: _ClassVar[int]
    END_BRANCH_FIELD_NUMBER: _ClassVar[int]
    QUIET_FIELD_NUMBER: _ClassVar[int]
    id: int
    resolve: ResolveRequest
    place: PlaceRequest
    end_branch: EndBranchRequest
    quiet: bool
    def __init__(self, id: _Optional[int] = ..., resolve: _Optional[_Union[ResolveRequest, _Mapping]] = ..., place: _Optional[_Union[PlaceRequest, _Mapping]] = ..., end_branch: _Optional[_Union[EndBranchRequest, _Mapping]] = ..., quiet: _Optional[bool] = ...) -> None: ...

class RouteBatch(_message.Message):
    __slots__ = ("ops",)
    OPS_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedCompositeFieldContainer[RouteOp]
    def __init__(self, ops: _Optional[_Iterable[_Union[RouteOp, _Mapping]]] = ...) -> None: ...

class RouteError(_message.Message):
    __slots__ = ("code", "reason")
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    code: int
    reason: str
    def __init__(self, code: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class RouteReply(_message.Message):
    __slots__ = ("id", "resolve", "place", "error", "end_branch")
    ID_FIELD_NUMBER: _ClassVar[int]
    RESOLVE_FIELD_NUMBER: _ClassVar[int]
    PLACE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    END_BRANCH_FIELD_NUMBER: _ClassVar[int]
    id: int
    resolve: ResolveResponse
    place: PlaceResponse
    error: RouteError
    end_branch: EndBranchResponse
    def __init__(self, id: _Optional[int] = ..., resolve: _Optional[_Union[ResolveResponse, _Mapping]] = ..., place: _Optional[_Union[PlaceResponse, _Mapping]] = ..., error: _Optional[_Union[RouteError, _Mapping]] = ..., end_branch: _Optional[_Union[EndBranchResponse, _Mapping]] = ...) -> None: ...

class RouteReplies(_message.Message):
    __slots__ = ("replies",)
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    replies: _containers.RepeatedCompositeFieldContainer[RouteReply]
    def __init__(self, replies: _Optional[_Iterable[_Union[RouteReply, _Mapping]]] = ...) -> None: ...

class EndBranchRequest(_message.Message):
    __slots__ = ("branch",)
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    branch: str
    def __init__(self, branch: _Optional[str] = ...) -> None: ...

class EndBranchResponse(_message.Message):
    __slots__ = ("released_nodes",)
    RELEASED_NODES_FIELD_NUMBER: _ClassVar[int]
    released_nodes: int
    def __init__(self, released_nodes: _Optional[int] = ...) -> None: ...

class SwitchPhaseRequest(_message.Message):
    __slots__ = ("node", "phase")
    NODE_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    node: str
    phase: Phase
    def __init__(self, node: _Optional[str] = ..., phase: _Optional[_Union[Phase, str]] = ...) -> None: ...

class SwitchPhaseResponse(_message.Message):
    __slots__ = ("previous_phase", "released_branches")
    PREVIOUS_PHASE_FIELD_NUMBER: _ClassVar[int]
    RELEASED_BRANCHES_FIELD_NUMBER: _ClassVar[int]
    previous_phase: Phase
    released_branches: int
    def __init__(self, previous_phase: _Optional[_Union[Phase, str]] = ..., released_branches: _Optional[int] = ...) -> None: ...

class DropNodeRequest(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: str
    def __init__(self, node: _Optional[str] = ...) -> None: ...

class DropNodeResponse(_message.Message):
    __slots__ = ("released_branches", "purged_blocks")
    RELEASED_BRANCHES_FIELD_NUMBER: _ClassVar[int]
    PURGED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    released_branches: int
    purged_blocks: int
    def __init__(self, released_branches: _Optional[int] = ..., purged_blocks: _Optional[int] = ...) -> None: ...

class EvictionOrderRequest(_message.Message):
    __slots__ = ("node", "limit")
    NODE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    node: str
    limit: int
    def __init__(self, node: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class EvictionEntry(_message.Message):
    __slots__ = ("block_hash", "count", "last_access")
    BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    LAST_ACCESS_FIELD_NUMBER: _ClassVar[int]
    block_hash: int
    count: int
    last_access: float
    def __init__(self, block_hash: _Optional[int] = ..., count: _Optional[int] = ..., last_access: _Optional[float] = ...) -> None: ...

class EvictionOrderResponse(_message.Message):
    __slots__ = ("blocks",)
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    blocks: _containers.RepeatedCompositeFieldContainer[EvictionEntry]
    def __init__(self, blocks: _Optional[_Iterable[_Union[EvictionEntry, _Mapping]]] = ...) -> None: ...

class WatchCountsRequest(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: str
    def __init__(self, node: _Optional[str] = ...) -> None: ...

class BlockCount(_message.Message):
    __slots__ = ("block_hash", "count")
    BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    block_hash: int
    count: int
    def __init__(self, block_hash: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class CountUpdate(_message.Message):
    __slots__ = ("node", "snapshot", "counts")
    NODE_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    node: str
    snapshot: bool
    counts: _containers.RepeatedCompositeFieldContainer[BlockCount]
    def __init__(self, node: _Optional[str] = ..., snapshot: _Optional[bool] = ..., counts: _Optional[_Iterable[_Union[BlockCount, _Mapping]]] = ...) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthResponse(_message.Message):
    __slots__ = ("serving", "store_ok", "nodes", "branches", "blocks")
    SERVING_FIELD_NUMBER: _ClassVar[int]
    STORE_OK_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    BRANCHES_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    serving: bool
    store_ok: bool
    nodes: int
    branches: int
    blocks: int
    def __init__(self, serving: _Optional[bool] = ..., store_ok: _Optional[bool] = ..., nodes: _Optional[int] = ..., branches: _Optional[int] = ..., blocks: _Optional[int] = ...) -> None: ...
