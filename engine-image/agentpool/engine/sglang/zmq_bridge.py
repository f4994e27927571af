"""The ZMQ side of the KV-event bridge: subscribe to SGLang's publisher, feed the mirror.

A message that is not a KV event batch is logged and counted, never fatal. A gap in the sequence
numbers asks the directory link for a resync from the mirror's block list (events were lost; SGLang's
optional replay socket is not used).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import zmq
import zmq.asyncio

from agentpool.engine.sglang.events import FrameError, SglangKvMirror, decode_frames

log = logging.getLogger(__name__)


class ZmqKvBridge:
    def __init__(
        self,
        endpoint: str,
        topic: str,
        mirror: SglangKvMirror,
        on_gap: Callable[[], None],
        context: zmq.asyncio.Context | None = None,
        on_batch: Callable[[], None] | None = None,
    ) -> None:
        """``on_batch``: called after each batch the mirror applied."""
        self.endpoint = endpoint
        self.topic = topic
        self.mirror = mirror
        self.on_gap = on_gap
        self.on_batch = on_batch
        self.context = context or zmq.asyncio.Context.instance()
        self.received = 0
        self.bad_frames = 0

    async def run(self) -> None:
        sock = self.context.socket(zmq.SUB)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self.endpoint)
            sock.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
            while True:
                frames = await sock.recv_multipart()
                self.handle(frames)
        finally:
            sock.close()

    def handle(self, frames: list[bytes]) -> None:
        try:
            batch = decode_frames(frames)
        except FrameError as e:
            self.bad_frames += 1
            log.warning("not a KV event batch from %s: %s", self.endpoint, e)
            return
        self.received += 1
        if self.mirror.apply(batch):
            log.warning("KV events lost before seq %d: resyncing the directory", batch.seq)
            self.on_gap()
        if self.on_batch is not None:
            self.on_batch()
