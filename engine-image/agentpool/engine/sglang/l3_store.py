"""The agent's side of SGLang's L3 storage backend: a Unix-socket server over :class:`L3Index`.

SGLang's scheduler processes (one per TP rank) load ``hicache_backend.AgentPoolStorage``, which maps
the host pool's shared-memory file and asks this server for slots (``l3_wire.py`` lists the ops). The
pool, its index and its eviction stay in the agent, so SGLang's role switch, which clears SGLang's
own host tier and calls its storage backend's ``clear()``, leaves the pages here; SGLang's next
request on them finds them with ``batch_exists`` and prefetches them back.

Access: the socket lives in a private directory (0700, one per agent, :func:`prepare_run_dir`),
the socket itself is 0600, and every connection's peer must run as this process's user
(``SO_PEERCRED``); others are closed at once and counted (``refused``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentpool.engine.errors import PoolFullError
from agentpool.engine.sglang.l3_index import L3Index, check_keys
from agentpool.engine.sglang.l3_wire import HEADER, WireError, decode, encode, frame_length

log = logging.getLogger(__name__)

SHM_NAME = "hostpool"
SOCKET_NAME = "l3.sock"
_OPS = frozenset({"hello", "clear", "exists", "pin", "unpin", "reserve", "commit", "release"})


class StoreDirError(OSError):
    """The run directory cannot be made."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def prepare_run_dir(base: Path, node_id: str) -> Path:
    """A new private directory (0700) ``base/agentpool-NODE.PID`` for the pool's shared-memory file
    and the socket. Directories of this node left by processes that are gone (or by an earlier
    process with this pid: a restarted container) are removed first, shared memory included."""
    base.mkdir(parents=True, exist_ok=True)
    prefix = f"agentpool-{node_id}."
    for old in base.glob(prefix + "*"):
        pid = old.name[len(prefix) :]
        if not pid.isdigit() or not old.is_dir() or old.stat().st_uid != os.getuid():
            continue
        if int(pid) == os.getpid() or not _alive(int(pid)):
            for name in (SOCKET_NAME, SHM_NAME):
                with contextlib.suppress(FileNotFoundError):
                    (old / name).unlink()
            with contextlib.suppress(OSError):
                old.rmdir()
    run_dir = base / f"{prefix}{os.getpid()}"
    try:
        run_dir.mkdir(mode=0o700)
    except FileExistsError:
        raise StoreDirError(f"{run_dir} exists and holds files this agent does not know") from None
    return run_dir


@dataclass(eq=False)
class _Conn:
    pinned: dict[str, int] = field(default_factory=dict)
    reserved: set[int] = field(default_factory=set)


class L3StoreServer:
    def __init__(self, index: L3Index, run_dir: Path) -> None:
        self.index = index
        self.run_dir = run_dir
        self.path = run_dir / SOCKET_NAME
        self.refused = 0
        self.requests = 0
        self._server: asyncio.AbstractServer | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def shm_path(self) -> Path:
        return self.run_dir / SHM_NAME

    def state(self) -> dict[str, int]:
        ix = self.index
        return {
            "pages": len(ix),
            "requests": self.requests,
            "refused": self.refused,
            "clears_kept": ix.kept_clears,
            "clears_dropped": ix.dropped_clears,
            "aliased": ix.aliased,
        }

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))
        os.chmod(self.path, 0o600)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for t in list(self._handlers):  # connections still open: end them here, not at loop teardown
                t.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._serve_conn(reader, writer)
        except asyncio.CancelledError:
            pass  # the server is closing
        finally:
            self._handlers.discard(task)

    async def _serve_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        if uid != os.getuid():
            self.refused += 1
            log.warning("L3 store: refused a connection from uid %d", uid)
            writer.close()
            return
        conn = _Conn()
        try:
            while True:
                try:
                    header = await reader.readexactly(HEADER)
                    msg = decode(await reader.readexactly(frame_length(header)))
                except asyncio.IncompleteReadError:
                    return
                except WireError as e:
                    writer.write(encode({"ok": False, "error": str(e)}))
                    await writer.drain()
                    return
                self.requests += 1
                writer.write(encode(self._handle(conn, msg)))
                await writer.drain()
        except ConnectionError:
            return
        finally:
            self._release(conn)
            writer.close()

    def _release(self, conn: _Conn) -> None:
        for key, n in conn.pinned.items():
            for _ in range(n):
                self.index.unpin([key])
        self.index.release(sorted(conn.reserved))

    def _handle(self, conn: _Conn, msg: dict[str, Any]) -> dict[str, Any]:
        op = msg.get("op")
        now = time.monotonic()
        ix = self.index
        if op not in _OPS:
            return {"ok": False, "error": f"unknown op {op!r}"}
        try:
            if op == "hello":
                page_bytes = msg.get("page_bytes")
                bb = ix.pool.block_bytes
                if page_bytes != bb:
                    return {
                        "ok": False,
                        "error": f"SGLang's page is {page_bytes} bytes, the pool's blocks {bb}",
                    }
                return {
                    "ok": True,
                    "shm": str(self.shm_path),
                    "size": ix.pool.buffer.nbytes,
                    "block_bytes": bb,
                }
            if op == "clear":
                return {"ok": True, "kept": ix.clear()}
            keys = check_keys(msg.get("keys"))
            if op == "exists":
                return {"ok": True, "n": ix.prefix(keys, now)}
            if op == "pin":
                pinned = ix.pin(keys, now)
                for k, s in zip(keys, pinned, strict=True):
                    if s is not None:
                        conn.pinned[k] = conn.pinned.get(k, 0) + 1
                return {"ok": True, "slots": pinned}
            if op == "unpin":
                for k in keys:
                    n = conn.pinned.get(k, 0)
                    if n:
                        ix.unpin([k])
                        if n > 1:
                            conn.pinned[k] = n - 1
                        else:
                            del conn.pinned[k]
                return {"ok": True}
            if op == "reserve":
                got = ix.reserve(keys)
                conn.reserved.update(s for s in got if s is not None)
                return {"ok": True, "slots": got}
            raw = msg.get("slots")
            if not isinstance(raw, list) or not all(isinstance(s, int) and s in conn.reserved for s in raw):
                return {"ok": False, "error": "slots must be slots this connection reserved"}
            taken: list[int] = raw
            if op == "commit":
                if len(taken) != len(keys):
                    return {"ok": False, "error": "commit: as many slots as keys"}
                conn.reserved.difference_update(taken)
                ix.commit(keys, taken, now)
                return {"ok": True}
            if op == "release":
                conn.reserved.difference_update(taken)
                ix.release(taken)
                return {"ok": True}
        except PoolFullError as e:
            return {"ok": False, "error": f"full: {e}"}
        except ValueError as e:
            return {"ok": False, "error": str(e)}
        raise AssertionError(op)  # every op in _OPS is handled above
