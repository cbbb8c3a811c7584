"""Durable producer id allocation: an id is handed out once, ever, also across restarts.

Ids are reserved in blocks: the end of the current block is persisted (atomically,
fsynced) before any id of the block is used, so after a crash allocation resumes
past every id that could have been handed out. A crash wastes at most one block.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...durable_file import atomic_write
from ...errors import ErrorCode, KafkaError

BLOCK_SIZE = 1000
MAX_PRODUCER_ID = (1 << 63) - 1


class ProducerIdManager:
    def __init__(self, path: str | Path, block_size: int = BLOCK_SIZE) -> None:
        self.path = Path(path)
        self.block_size = block_size
        self._next = 0
        self._block_end = 0  # first id not reserved yet

    def load(self) -> None:
        try:
            doc = json.loads(self.path.read_text())
            reserved = int(doc["next_block_start"])
        except FileNotFoundError:
            reserved = 0
        except (ValueError, KeyError, TypeError) as exc:
            raise RuntimeError(f"producer id block file {self.path} is damaged: {exc}") from exc
        self._next = self._block_end = reserved

    def next_id(self) -> int:
        if self._next >= self._block_end:
            end = self._next + self.block_size
            if end > MAX_PRODUCER_ID:
                raise KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR, "producer ids exhausted")
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(self.path, json.dumps({"version": 1, "next_block_start": end}).encode())
            except OSError as exc:
                raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"cannot reserve producer ids: {exc}") from exc
            self._block_end = end
        pid = self._next
        self._next += 1
        return pid
