"""Which partitions this broker may serve, and on what terms: the seam between handlers and replication.

Handlers never decide leadership themselves. They ask a `PartitionAccess` for the partition they are about to
serve (`leader`), get either the local `Partition` or the error code Kafka answers in that case, and ask it the
few things that differ between one broker and a replicated cluster: the leader epoch to report, the log start
offset a client may be told, whether an acks=all append may start (min.insync.replicas) and when it is done.

`LocalPartitionAccess` is the single node: it leads every partition it holds at leader epoch 0 with the ISR
{itself}, and "done" for acks=all means fsynced (the group-commit flusher). Its checks are one dict lookup and an
int compare per partition, so the single node keeps its speed. The cluster implementation
(`cluster/replica_manager.py`) answers the same questions from the metadata image and its follower tracking.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, NamedTuple, Protocol

from ..errors import ErrorCode

if TYPE_CHECKING:
    from ..storage.flusher import GroupCommitFlusher
    from ..storage.log_manager import LogManager
    from ..storage.partition import Partition

NO_EPOCH = -1  # a request that carries no leader epoch (Kafka's RecordBatch.NO_PARTITION_LEADER_EPOCH)
UNDEFINED_EPOCH_OFFSET = -1  # OffsetsForLeaderEpoch: no end offset known for that epoch
LOCAL_LEADER_EPOCH = 0  # the single node's leader epoch, for every partition


class PartitionView(NamedTuple):
    """What Metadata says about one partition."""

    leader: int  # -1: no leader (offline)
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    offline: list[int]


def check_leader_epoch(requested: int, current: int) -> ErrorCode:
    """The fencing rule of KIP-320 for a request that names the leader epoch it believes in: an older one is
    FENCED_LEADER_EPOCH (the client's metadata is stale; it refreshes), a newer one UNKNOWN_LEADER_EPOCH (this
    broker has not learned of the election yet; the client retries). -1 means the request names none."""
    if requested == NO_EPOCH or requested == current:
        return ErrorCode.NONE
    return ErrorCode.FENCED_LEADER_EPOCH if requested < current else ErrorCode.UNKNOWN_LEADER_EPOCH


class PartitionAccess(Protocol):
    """What handlers ask about the partitions they serve. Every method runs on the event loop."""

    def leader(self, topic: str, partition: int, current_leader_epoch: int = NO_EPOCH) -> Partition | ErrorCode:
        """The local partition if this broker leads it at `current_leader_epoch` (or the request named none);
        otherwise UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH or
        UNKNOWN_LEADER_EPOCH. Constant time: it is on every produce and fetch."""
        ...

    def leader_epoch(self, topic: str, partition: int) -> int:
        """The partition's current leader epoch as this broker knows it, -1 if it knows none."""
        ...

    def describe(self, topic: str, partition: int) -> PartitionView:
        """Leader, epoch, replicas and ISR for Metadata answers."""
        ...

    def log_start_offset(self, part: Partition) -> int:
        """The log start offset a client may be told (a replicated leader answers the ISR's minimum)."""
        ...

    def check_append(self, part: Partition, acks: int) -> ErrorCode:
        """Before appending a produce: NOT_ENOUGH_REPLICAS when acks=all and the ISR is below
        min.insync.replicas, NOT_LEADER_OR_FOLLOWER when leadership cannot be exercised (lost session)."""
        ...

    def wait_acks_all(self, part: Partition, end_offset: int, timeout_ms: int) -> Awaitable[None]:
        """An awaitable that returns once every offset below `end_offset` is acknowledged as acks=all requires; raise `KafkaError`
        (KAFKA_STORAGE_ERROR, NOT_ENOUGH_REPLICAS_AFTER_APPEND, REQUEST_TIMED_OUT, NOT_LEADER_OR_FOLLOWER)."""
        ...

    async def wait_log_start(self, part: Partition, offset: int, timeout_ms: int) -> int:
        """After a local DeleteRecords to `offset`: return the low watermark to answer once the replicas
        have it (a replicated leader waits for the ISR's minimum); raise `KafkaError` past the timeout."""
        ...

    def end_offset_for_epoch(self, part: Partition, epoch: int) -> tuple[int, int]:
        """OffsetsForLeaderEpoch: (largest epoch <= `epoch` this replica knows, that epoch's end offset), or
        (-1, -1) when none is known."""
        ...

    def epoch_for_offset(self, part: Partition, offset: int) -> int:
        """The leader epoch that wrote `offset` (ListOffsets answers it), -1 if unknown."""
        ...


class LocalPartitionAccess:
    """The single node: every local partition is led here at epoch 0, ISR = {this broker}, acks=all = fsynced.

    min.insync.replicas is not checked: with one replica there is nothing to wait for, and the single node has
    always accepted acks=all whatever the setting (a replicated cluster checks it)."""

    def __init__(self, logs: LogManager, flusher: GroupCommitFlusher, node_id: int) -> None:
        self._logs = logs
        self._flusher = flusher
        self._node_id = node_id

    def leader(self, topic: str, partition: int, current_leader_epoch: int = NO_EPOCH) -> Partition | ErrorCode:
        part = self._logs.get_partition(topic, partition)
        if part is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if current_leader_epoch != NO_EPOCH and current_leader_epoch != LOCAL_LEADER_EPOCH:
            return check_leader_epoch(current_leader_epoch, LOCAL_LEADER_EPOCH)
        return part

    def leader_epoch(self, topic: str, partition: int) -> int:
        return LOCAL_LEADER_EPOCH if self._logs.get_partition(topic, partition) is not None else NO_EPOCH

    def describe(self, topic: str, partition: int) -> PartitionView:
        node = self._node_id
        return PartitionView(node, LOCAL_LEADER_EPOCH, [node], [node], [])

    def log_start_offset(self, part: Partition) -> int:
        return part.log.log_start_offset

    def check_append(self, part: Partition, acks: int) -> ErrorCode:
        return ErrorCode.NONE

    def wait_acks_all(self, part: Partition, end_offset: int, timeout_ms: int) -> Awaitable[None]:
        # The flusher's own coroutine, not one wrapping it: this is on every acks=all produce.
        return self._flusher.wait_durable(part.log, end_offset)

    async def wait_log_start(self, part: Partition, offset: int, timeout_ms: int) -> int:
        return part.log.log_start_offset

    def end_offset_for_epoch(self, part: Partition, epoch: int) -> tuple[int, int]:
        # Epoch 0 began at the log start and is still current, so it ends at the log end (Kafka answers the log
        # end offset for the current epoch, to followers and consumers alike).
        # No epoch was before it, and none after it is known.
        if epoch == LOCAL_LEADER_EPOCH:
            return LOCAL_LEADER_EPOCH, part.log.log_end_offset
        return NO_EPOCH, UNDEFINED_EPOCH_OFFSET

    def epoch_for_offset(self, part: Partition, offset: int) -> int:
        return LOCAL_LEADER_EPOCH
