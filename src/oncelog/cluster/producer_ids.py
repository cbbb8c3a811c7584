"""Producer ids in cluster mode: blocks reserved on ZooKeeper, so no two brokers ever hand out the same id.

The single node reserves its blocks in a file of its data directory (coordinator/txn/producer_ids.py). A cluster
cannot: an idempotent producer's id names its state on every partition it writes, on every broker, so ids must
be unique across brokers and must not come back if one broker loses its disk. Each broker reserves the next block
with a compare-and-set on the coordination service (`MetadataStore.allocate_producer_ids`) and hands ids out of it
synchronously, as the single node's manager does; the next block is fetched in the background once half of the
current one is used, so InitProducerId does not wait on ZooKeeper. With no block at hand (the service unreachable
since before the previous block ran out) it answers COORDINATOR_LOAD_IN_PROGRESS, which clients retry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from ..errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

BLOCK_SIZE = 1000
RETRY_S = 1.0


class ClusterProducerIds:
    """`next_id()` as `ProducerIdManager` offers it, over blocks reserved by `allocate(block_size)`."""

    def __init__(self, allocate: Callable[[int], Awaitable[tuple[int, int]]], block_size: int = BLOCK_SIZE) -> None:
        self._allocate = allocate
        self.block_size = block_size
        self._blocks: list[tuple[int, int]] = []  # [start, end) reserved and not used up, oldest first
        self._next = 0
        self._refill: asyncio.Task | None = None
        self._closed = False

    async def start(self) -> None:
        """Reserve the first block (the coordination service is reachable when the broker starts)."""
        self._push(await self._allocate(self.block_size))

    async def stop(self) -> None:
        self._closed = True
        if self._refill is not None:
            self._refill.cancel()
            await asyncio.gather(self._refill, return_exceptions=True)

    def _push(self, block: tuple[int, int]) -> None:
        if not self._blocks:
            self._next = block[0]
        self._blocks.append(block)

    def _remaining(self) -> int:
        if not self._blocks:
            return 0
        return (self._blocks[0][1] - self._next) + sum(end - start for start, end in self._blocks[1:])

    def next_id(self) -> int:
        while self._blocks and self._next >= self._blocks[0][1]:
            self._blocks.pop(0)
            if self._blocks:
                self._next = self._blocks[0][0]
        if self._remaining() <= self.block_size // 2:
            self._start_refill()
        if not self._blocks:
            raise KafkaError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                             "No producer ids reserved yet: the coordination service is not reachable")
        pid = self._next
        self._next += 1
        return pid

    def _start_refill(self) -> None:
        if self._closed or (self._refill is not None and not self._refill.done()):
            return
        self._refill = asyncio.get_running_loop().create_task(self._fetch_block())

    async def _fetch_block(self) -> None:
        while not self._closed:
            try:
                self._push(await self._allocate(self.block_size))
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store unreachable: try again, InitProducerId answers retriable
                log.warning("reserving producer ids failed (%s); retrying in %.0f s", exc, RETRY_S)
                await asyncio.sleep(RETRY_S)
