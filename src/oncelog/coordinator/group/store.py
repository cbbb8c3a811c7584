"""`__consumer_offsets` through the broker's partition access: append, wait until acknowledged, replay.

The coordinator talks to this narrow interface only (`OffsetsLog`), so unit tests can give
it an in-memory log. Appends are synchronous, so records reach the log in the order the
coordinator decided them; the acknowledgement wait is separate, and a reply that promises
durability awaits it. Writes go through the broker's `PartitionAccess` as a produce with
acks=all would: on the single node that is "fsynced"; replicated, it is "durable on every
in-sync replica" (the replicated high watermark passed it), within `offsets.commit.timeout.ms`.
Each append names the leader epoch the coordinator loaded the partition under, so a
coordinator whose partition moved to another leader cannot write to it any more.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

from ...errors import ErrorCode, KafkaError
from ...records.batch import read_header
from ...records.builder import NewRecord, build_batch
from ...records.reader import CorruptRecordsError
from ..partitioning import partition_for
from .settings import OFFSET_COMMIT_TIMEOUT_MS

if TYPE_CHECKING:
    from ...config import BrokerConfig
    from ...storage.flusher import GroupCommitFlusher
    from ...storage.log_manager import LogManager
    from ...storage.partition import Partition
    from ..host import InternalPartitions

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"
# Kafka's offsets.topic.segment.bytes default: small segments keep compaction (and our replay) cheap.
def offsets_topic_config(config: BrokerConfig) -> dict[str, object]:
    """The topic settings __consumer_offsets is created with: compacted, segments of offsets.topic.segment.bytes
    (Kafka's 100 MiB by default) so that closed segments exist for the cleaner."""
    return {"cleanup.policy": "compact", "segment.bytes": config["offsets.topic.segment.bytes"]}
SEQUENCE_SPACE = 1 << 31
# Leadership answers of the partition access that mean "this broker is not the coordinator any more".
_NOT_LEADER = frozenset({ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH,
                         ErrorCode.UNKNOWN_LEADER_EPOCH})


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
               producer: TxnProducer | None = None, leader_epoch: int = -1) -> Written:
        """Append now (leader epoch -1: whatever epoch the partition has); `durable` waits for the acknowledgement."""
        ...

    async def durable(self, written: Written) -> ErrorCode: ...

    def end_offset(self, partition: int) -> int:
        """The partition's log end offset: a load replays up to it."""
        ...

    def replay(self, partition: int, start: int | None = None) -> Iterator[StoredRecord | StoredMarker]:
        """Records and markers from `start` (default: the log start) to the log end as of the first step."""
        ...


class _LocalPartitions:
    """The single node's answers, for an `OffsetsTopic` built without the broker's partition access (tools and
    tests on bare storage): every local partition is led here, acknowledged = fsynced."""

    def __init__(self, logs: LogManager, flusher: GroupCommitFlusher) -> None:
        self._logs = logs
        self._flusher = flusher

    def leader(self, topic: str, partition: int, current_leader_epoch: int = -1) -> Partition | ErrorCode:
        part = self._logs.get_partition(topic, partition)
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if part is None else part

    def leader_epoch(self, topic: str, partition: int) -> int:
        return 0 if self._logs.get_partition(topic, partition) is not None else -1

    def check_append(self, part: Partition, acks: int) -> ErrorCode:
        return ErrorCode.NONE

    def wait_acks_all(self, part: Partition, end_offset: int, timeout_ms: int) -> Awaitable[None]:
        return self._flusher.wait_durable(part.log, end_offset)


class OffsetsTopic:
    """`OffsetsLog` over the broker's LogManager and partition access (`access` returns it at each call, so a
    broker may swap its access after the coordinator was built)."""

    def __init__(self, logs: LogManager, flusher: GroupCommitFlusher, partitions: int,
                 transactional_id_of: Callable[[int], str | None] | None = None,
                 access: Callable[[], InternalPartitions] | None = None,
                 commit_timeout_ms: int = OFFSET_COMMIT_TIMEOUT_MS) -> None:
        self.logs = logs
        self.flusher = flusher
        self.partitions = partitions
        self._transactional_id_of = transactional_id_of
        local = _LocalPartitions(logs, flusher)
        self._access: Callable[[], InternalPartitions] = access or (lambda: local)
        self.commit_timeout_ms = commit_timeout_ms

    def ensure(self) -> None:
        """The single node: create the topic on first start; afterwards its partition count is what it was
        created with."""
        if OFFSETS_TOPIC not in self.logs.topics:
            self.logs.create_topic(OFFSETS_TOPIC, self.partitions, offsets_topic_config(self.logs.config),
                                   internal=True)
            log.info("created %s with %d partitions", OFFSETS_TOPIC, self.partitions)
        self.adopt_partition_count()

    def adopt_partition_count(self) -> None:
        """A broker that did not create the topic takes its partition count from the local copy, once it has one
        (cluster mode: the controller created it, with offsets.topic.num.partitions of its own config)."""
        meta = self.logs.topics.get(OFFSETS_TOPIC)
        if meta is not None and meta.partitions != self.partitions:
            log.warning("%s has %d partitions; offsets.topic.num.partitions=%d is ignored once it exists",
                        OFFSETS_TOPIC, meta.partitions, self.partitions)
            self.partitions = meta.partitions

    def partition_for(self, group_id: str) -> int:
        return partition_for(group_id, self.partitions)

    def _partition(self, partition: int) -> Partition | None:
        return self.logs.get_partition(OFFSETS_TOPIC, partition)

    def append(self, partition: int, records: Sequence[tuple[bytes, bytes | None]], now_ms: int,
               producer: TxnProducer | None = None, leader_epoch: int = -1) -> Written:
        access = self._access()
        part = access.leader(OFFSETS_TOPIC, partition, leader_epoch)
        if isinstance(part, ErrorCode):
            if part in _NOT_LEADER:
                return Written(ErrorCode.NOT_LEADER_OR_FOLLOWER,
                               f"{OFFSETS_TOPIC}-{partition} is not led here at epoch {leader_epoch}")
            return Written(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{OFFSETS_TOPIC}-{partition} does not exist")
        refused = access.check_append(part, -1)
        if refused:
            return Written(refused, f"{OFFSETS_TOPIC}-{partition}: {refused.name}")
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
            await self._access().wait_acks_all(part, written.last_offset + 1, self.commit_timeout_ms)
        except KafkaError as exc:
            log.error("%s-%d: offset %d is not acknowledged: %s", OFFSETS_TOPIC, written.partition,
                      written.last_offset, exc.message)
            return exc.code
        return ErrorCode.NONE

    def end_offset(self, partition: int) -> int:
        part = self._partition(partition)
        return 0 if part is None else part.log.log_end_offset

    def replay(self, partition: int, start: int | None = None) -> Iterator[StoredRecord | StoredMarker]:
        part = self._partition(partition)
        if part is None:
            return
        try:
            for batch in part.iter_decoded_batches(start):
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
