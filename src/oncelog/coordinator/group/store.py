"""`__consumer_offsets` on the broker's own storage: append, wait until durable, replay.

The coordinator talks to this narrow interface only (`OffsetsLog`), so unit tests can give
it an in-memory log and a multi-broker version can put replication behind it. Appends are
synchronous, so records reach the log in the order the coordinator decided them; the
durability wait is separate, and a reply that promises durability awaits it (acks=all).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

from ...errors import ErrorCode, KafkaError
from ...records.batch import read_header
from ...records.builder import NewRecord, build_batch
from ...records.reader import CorruptRecordsError
from ..partitioning import partition_for

if TYPE_CHECKING:
    from ...storage.flusher import GroupCommitFlusher
    from ...storage.log_manager import LogManager
    from ...storage.partition import Partition

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"
# Kafka's offsets.topic.segment.bytes default: small segments keep compaction (and our replay) cheap.
OFFSETS_TOPIC_CONFIG = {"cleanup.policy": "compact", "segment.bytes": 104857600}
SEQUENCE_SPACE = 1 << 31


class TxnProducer(NamedTuple):
    producer_id: int
    producer_epoch: int
    transactional_id: str | None


class Written(NamedTuple):
    error: ErrorCode
    message: str | None
    partition: int = -1
    base_offset: int = -1
    last_offset: int = -1


class StoredRecord(NamedTuple):
    """One record found while replaying; `producer_id` is -1 unless its batch is transactional."""

    key: bytes
    value: bytes | None
    batch_offset: int
    producer_id: int


class StoredMarker(NamedTuple):
    producer_id: int
    commit: bool


class OffsetsLog(Protocol):
    partitions: int

    def partition_for(self, group_id: str) -> int: ...

    def append(self, partition: int, records: Sequence[tuple[bytes, bytes | None]], now_ms: int,
               producer: TxnProducer | None = None) -> Written: ...

    async def durable(self, written: Written) -> ErrorCode: ...

    def replay(self, partition: int) -> Iterator[StoredRecord | StoredMarker]: ...


class OffsetsTopic:
    """`OffsetsLog` over the broker's LogManager and group-commit flusher."""

    def __init__(self, logs: LogManager, flusher: GroupCommitFlusher, partitions: int,
                 transactional_id_of: Callable[[int], str | None] | None = None) -> None:
        self.logs = logs
        self.flusher = flusher
        self.partitions = partitions
        self._transactional_id_of = transactional_id_of

    def ensure(self) -> None:
        """Create the topic on first start; afterwards its partition count is what it was created with."""
        meta = self.logs.topics.get(OFFSETS_TOPIC)
        if meta is None:
            meta = self.logs.create_topic(OFFSETS_TOPIC, self.partitions, OFFSETS_TOPIC_CONFIG, internal=True)
            log.info("created %s with %d partitions", OFFSETS_TOPIC, self.partitions)
        elif meta.partitions != self.partitions:
            log.warning("%s has %d partitions; offsets.topic.num.partitions=%d is ignored once it exists",
                        OFFSETS_TOPIC, meta.partitions, self.partitions)
            self.partitions = meta.partitions

    def partition_for(self, group_id: str) -> int:
        return partition_for(group_id, self.partitions)

    def _partition(self, partition: int) -> Partition | None:
        return self.logs.get_partition(OFFSETS_TOPIC, partition)

    def append(self, partition: int, records: Sequence[tuple[bytes, bytes | None]], now_ms: int,
               producer: TxnProducer | None = None) -> Written:
        part = self._partition(partition)
        if part is None:
            return Written(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{OFFSETS_TOPIC}-{partition} does not exist")
        new = [NewRecord(key, value, timestamp_ms=now_ms) for key, value in records]
        txn_id = None
        if producer is None:
            buf = build_batch(new)
        else:
            buf = build_batch(new, transactional=True, producer_id=producer.producer_id,
                              producer_epoch=producer.producer_epoch,
                              base_sequence=_next_sequence(part, producer.producer_id, producer.producer_epoch))
            txn_id = producer.transactional_id
            if txn_id is None and self._transactional_id_of is not None:
                txn_id = self._transactional_id_of(producer.producer_id)
        try:
            result = part.append_records(buf, read_header(buf), now_ms, False, transactional_id=txn_id)
        except KafkaError as exc:
            return Written(exc.code, exc.message)
        if result.error:
            return Written(result.error, result.message)
        return Written(ErrorCode.NONE, None, partition, result.base_offset, result.last_offset)

    async def durable(self, written: Written) -> ErrorCode:
        if written.error:
            return written.error
        part = self._partition(written.partition)
        if part is None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        try:
            await self.flusher.wait_durable(part.log, written.last_offset + 1)
        except KafkaError as exc:
            log.error("%s-%d is not durable: %s", OFFSETS_TOPIC, written.partition, exc.message)
            return exc.code
        return ErrorCode.NONE

    def replay(self, partition: int) -> Iterator[StoredRecord | StoredMarker]:
        part = self._partition(partition)
        if part is None:
            return
        try:
            for batch in part.iter_decoded_batches():
                header = batch.header
                if header.is_control:
                    if batch.marker is not None:
                        yield StoredMarker(header.producer_id, batch.marker.commit)
                    continue
                producer_id = header.producer_id if header.is_transactional else -1
                for record in batch.records:
                    if record.key is None:
                        log.warning("%s: keyless record at offset %d skipped", part.name, record.offset)
                        continue
                    yield StoredRecord(bytes(record.key), None if record.value is None else bytes(record.value),
                                       header.base_offset, producer_id)
        except CorruptRecordsError as exc:
            log.error("%s: unreadable batch, groups and offsets after offset %s are not loaded: %s",
                      part.name, exc.base_offset, exc)


def _next_sequence(part: Partition, producer_id: int, epoch: int) -> int:
    """The sequence the partition's producer state expects next from this producer.

    Kafka appends coordinator batches with sequence -1 and an origin that skips sequence checks;
    `Partition.append_records` has no such origin, so the coordinator continues the producer's
    sequence on this partition instead (0 when the partition has no state for it at this epoch).
    """
    entry = part.producers.entries.get(producer_id)
    if entry is None or entry.epoch != epoch or entry.last_seq < 0:
        return 0
    return (entry.last_seq + 1) % SEQUENCE_SPACE
