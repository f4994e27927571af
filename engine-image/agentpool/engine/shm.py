"""A named shared-memory buffer: a file (under ``/dev/shm``) that two processes map.

The agent creates it for its host pool (:class:`agentpool.engine.hostpool.HostPool` with ``shm_path``),
NIXL registers the mapping as DRAM as it registers any host buffer, and SGLang's scheduler processes
map the same file (:mod:`agentpool.engine.sglang.l3_client`) to copy pages in and out of it.

The file is created exclusively with mode 0600 (only this user's processes can map it); an existing
file is an error, never reused. :meth:`ShmBuffer.close` unlinks it.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from pathlib import Path

import numpy as np
import numpy.typing as npt


class ShmError(OSError):
    """The shared-memory file cannot be created or mapped as asked."""


class ShmBuffer:
    """``size`` bytes mapped from ``path``; ``array`` is a uint8 view of the mapping."""

    def __init__(self, path: Path, size: int, *, create: bool) -> None:
        if size <= 0:
            raise ShmError(f"a shared-memory buffer needs a positive size, got {size}")
        self.path = path
        self.size = size
        self.owner = create
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        try:
            fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o600)
        except FileExistsError:
            raise ShmError(
                f"shared-memory file {path} exists already (another agent, or a stale one)"
            ) from None
        except OSError as e:
            raise ShmError(f"cannot open shared-memory file {path}: {e.strerror}") from None
        try:
            if create:
                os.ftruncate(fd, size)
            else:
                have = os.fstat(fd).st_size
                if have != size:
                    raise ShmError(f"shared-memory file {path} holds {have} bytes, {size} expected")
            self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as e:
            if create:
                os.unlink(path)
            if isinstance(e, ShmError):
                raise
            raise ShmError(f"cannot map shared-memory file {path}: {e}") from None
        finally:
            os.close(fd)
        self.array: npt.NDArray[np.uint8] = np.frombuffer(self._map, dtype=np.uint8)

    def close(self) -> None:
        """Unlink the file (the creator only). Mappings stay valid until their arrays are gone."""
        if self.owner:
            self.owner = False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
