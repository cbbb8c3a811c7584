"""Durable producer id allocation: an id is handed out once, ever, also across restarts.

Ids are reserved in blocks: the end of the current block is persisted (atomically,
fsynced) before any id of the block is used, so after a crash allocation resumes
past every id that could have been handed out. A crash wastes at most two blocks.

The file write (three fsyncs, about 10 ms here) must not hold the event loop inside an
InitProducerId (issue 24: the loop monitor caught it at 9.9 ms): the first block is
reserved at load, and each next one on a thread of its own once 90% of the current block
is handed out (as Kafka's ProducerIdManager prefetches its next block). `next_id` waits
for that write only when the block ran out before it finished, and writes itself only
when it failed; two writes of the file never overlap.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ...durable_file import atomic_write
from ...errors import ErrorCode, KafkaError

BLOCK_SIZE = 1000
MAX_PRODUCER_ID = (1 << 63) - 1
PREFETCH_AT = 0.9  # share of a block handed out when the next one is reserved

log = logging.getLogger(__name__)


class ProducerIdManager:
    def __init__(self, path: str | Path, block_size: int = BLOCK_SIZE) -> None:
        self.path = Path(path)
        self.block_size = block_size
        self._next = 0
        self._block_end = 0  # first id not reserved yet
        self._block_start = 0
        self._reserved_end = 0  # what the file says: every id below it may have been handed out
        self._prefetch: Future[tuple[int, int]] | None = None  # the next block's write, in flight or done
        self._writer: ThreadPoolExecutor | None = None

    def load(self) -> None:
        """Read the file and reserve the first block (on the calling thread: the broker is not serving yet)."""
        try:
            doc = json.loads(self.path.read_text())
            reserved = int(doc["next_block_start"])
        except FileNotFoundError:
            reserved = 0
        except (ValueError, KeyError, TypeError) as exc:
            raise RuntimeError(f"producer id block file {self.path} is damaged: {exc}") from exc
        self._next = self._block_end = self._block_start = self._reserved_end = reserved
        try:
            self._use(self._write_block(reserved))
        except KafkaError as exc:  # the first InitProducerId tries again and reports it
            log.error("%s", exc.message)

    def next_id(self) -> int:
        if self._next >= self._block_end:
            block = None
            if self._prefetch is not None:
                prefetch, self._prefetch = self._prefetch, None
                try:
                    block = prefetch.result()  # waits only if its write is still running
                except KafkaError as exc:
                    log.warning("reserving the next producer id block in the background failed: %s", exc.message)
            self._use(block if block is not None else self._write_block(self._reserved_end))
        pid = self._next
        self._next += 1
        if self._prefetch is None and self._next - self._block_start >= PREFETCH_AT * self.block_size:
            if self._writer is None:
                self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="oncelog-producer-ids")
            self._prefetch = self._writer.submit(self._write_block, self._reserved_end)
        return pid

    def _use(self, block: tuple[int, int]) -> None:
        self._block_start, self._block_end = block
        self._next = block[0]

    def _write_block(self, start: int) -> tuple[int, int]:
        """Make [start, start + block_size) usable: the file says its end first. Never two at once: the thread
        writes only what `next_id` asked for, and `next_id` writes only with no write of the thread pending."""
        end = start + self.block_size
        if end > MAX_PRODUCER_ID:
            raise KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR, "producer ids exhausted")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path, json.dumps({"version": 1, "next_block_start": end}).encode())
        except OSError as exc:
            raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"cannot reserve producer ids: {exc}") from exc
        self._reserved_end = end
        return start, end
