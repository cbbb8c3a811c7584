"""A partition: its log plus the state derived from it (producer state).

This is the narrow interface the broker's handlers (and, later, the transaction
coordinator) use: `append_records` checks and appends in one synchronous step on the
event loop, so no other append can slip between the producer-state verdict and the
write. Producer state is snapshotted whenever data it was built from could go away
(segment roll, segment deletion, clean shutdown), always after the log is durable up
to the snapshot's offset, so a snapshot never describes data a crash can take back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..errors import ErrorCode, KafkaError
from ..records.batch import BatchHeader
from .partition_log import PartitionLog
from .producer_state import ProducerStateManager

log = logging.getLogger(__name__)


@dataclass(slots=True)
class AppendResult:
    error: ErrorCode = ErrorCode.NONE
    message: str | None = None
    base_offset: int = -1
    last_offset: int = -1
    log_append_time: int = -1
    duplicate: bool = False


class Partition:
    def __init__(self, plog: PartitionLog, max_producer_batches: int = 5) -> None:
        self.log = plog
        self.topic = plog.topic
        self.index = plog.partition
        self.producers = ProducerStateManager(plog.directory, plog.name, max_producer_batches)
        plog.on_roll = self._on_roll
        plog.before_delete = self._before_delete

    @property
    def name(self) -> str:
        return self.log.name

    # -- recovery ---------------------------------------------------------------------------------------
    def load_producer_state(self, now_ms: int) -> None:
        """Newest snapshot at or below the log end, then replay the batches after it."""
        plog = self.log
        start = self.producers.load_latest_snapshot(plog.log_end_offset)
        first_base = plog.segments[0].base_offset if plog.segments else 0
        replay_from = first_base if start is None else start
        if start is not None and start < first_base:
            log.warning(
                "%s: producer snapshot at %d is older than the oldest segment (%d); producers whose only "
                "batches were in between are forgotten", self.name, start, first_base,
            )
            replay_from = first_base
        replayed = 0
        for header in plog.iter_batches(replay_from, plog.log_end_offset):
            if header.base_offset < replay_from:
                continue
            self.producers.record(header, header.base_offset, now_ms)
            replayed += 1
        if replayed or start != plog.log_end_offset:
            self.snapshot()
        log.debug("%s: producer state of %d producers (snapshot %s, %d batches replayed)",
                  self.name, len(self.producers.entries), start, replayed)

    # -- appends ----------------------------------------------------------------------------------------
    def append_records(self, buf, header: BatchHeader, now_ms: int, log_append_time: bool) -> AppendResult:
        """Check a validated client batch against producer state and append it, atomically."""
        check = self.producers.check(header)
        if check.duplicate is not None:
            cached = check.duplicate
            return AppendResult(
                base_offset=cached.first_offset, last_offset=cached.last_offset,
                log_append_time=cached.max_timestamp if log_append_time else -1, duplicate=True,
            )
        if check.error:
            return AppendResult(check.error, check.message)
        try:
            base = self.log.append(buf, header)
        except KafkaError as exc:
            return AppendResult(exc.code, exc.message)
        self.producers.record(header, base, now_ms)
        return AppendResult(
            base_offset=base, last_offset=base + header.last_offset_delta,
            log_append_time=header.max_timestamp if log_append_time else -1,
        )

    # -- snapshots --------------------------------------------------------------------------------------
    def snapshot(self) -> None:
        """Make the log durable to its end, then write the producer state as of that offset."""
        try:
            self.log.sync_now()
            self.producers.write_snapshot(self.log.log_end_offset)
        except (KafkaError, OSError) as exc:
            log.error("%s: producer-state snapshot failed: %s", self.name, exc)

    def _on_roll(self, new_base: int) -> None:
        self.snapshot()

    def _before_delete(self) -> None:
        self.snapshot()

    def expire_producers(self, now_ms: int, expiration_ms: int) -> list[int]:
        return self.producers.expire(now_ms, expiration_ms)

    def close(self) -> None:
        if not self.log.offline:
            self.snapshot()
        self.log.close()

    def delete(self) -> None:
        self.log.delete()
