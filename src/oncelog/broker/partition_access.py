"""Which partitions this broker may serve, and on what terms: the seam between handlers and replication.

Handlers never decide leadership themselves. They ask a `PartitionAccess` for the partition they are about to
serve (`leader`), get either the local `Partition` or the error code Kafka answers in that case, and ask it the
few things that differ between one broker and a replicated cluster: the leader epoch to report, the log start
offset a client may be told, whether an acks=all append may start (min.insync.replicas) and when it is done.

`LocalPartitionAccess` is the single node: it leads every partition it holds at leader epoch 0 with the ISR
{itself}, and "done" for acks=all means fsynced (the group-commit flusher). Its checks are one dict lookup and an
int compare per partition, so the single node keeps its speed. `ReplicatedPartitionAccess` is cluster mode: it
answers the same questions from the replica manager (`cluster/replica_manager.py`: roles from the metadata image,
follower tracking, the replicated high watermark) and the image (Metadata).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, NamedTuple, Protocol

from ..errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from ..cluster.metadata_image import MetadataImage
    from ..cluster.replica_manager import Replica, ReplicaManager
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

    def replica(self, topic: str, partition: int) -> Partition | ErrorCode:
        """The local copy whatever its role (leader or follower), for what Kafka answers from any replica
        (DescribeProducers sent to a named broker, as `kafka-transactions find-hanging` does); otherwise
        UNKNOWN_TOPIC_OR_PARTITION, or NOT_LEADER_OR_FOLLOWER when the partition exists but has no copy here."""
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

    def offsets_available(self, part: Partition) -> bool:
        """False while a new leader's high watermark has not reached the start of its epoch: ListOffsets LATEST
        then answers OFFSET_NOT_AVAILABLE (Kafka's rule) instead of an offset older than the last one given."""
        ...

    def appended(self, part: Partition) -> None:
        """A produce appended to `part` (followers waiting in a fetch may go on at once)."""
        ...

    def replica_fetch(self, part: Partition, replica_id: int, fetch_offset: int, log_start_offset: int,
                      broker_epoch: int = -1) -> ErrorCode | None:
        """A fetch from the follower `replica_id` (fetch offset = its durable end, its log start offset and broker
        epoch): NONE to serve it as a replica (up to the log end), an error to answer (STALE_BROKER_EPOCH for a
        stale incarnation), or None when this broker has no replicas and serves it as a consumer fetch."""
        ...

    async def producer_snapshot(self, part: Partition, replica_id: int) -> tuple[bytes, int, int]:
        """FetchSnapshot from the follower `replica_id` whose log started over: (this leader's producer state in
        the snapshot format, the offset it describes, the leader epoch), answered once that offset is committed
        (docs/cluster.md §4.7); raise `KafkaError` (NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT)."""
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

    def replica(self, topic: str, partition: int) -> Partition | ErrorCode:
        return self.leader(topic, partition)

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

    def offsets_available(self, part: Partition) -> bool:
        return True

    def appended(self, part: Partition) -> None:
        pass

    def replica_fetch(self, part: Partition, replica_id: int, fetch_offset: int, log_start_offset: int,
                      broker_epoch: int = -1) -> ErrorCode | None:
        return None

    async def producer_snapshot(self, part: Partition, replica_id: int) -> tuple[bytes, int, int]:
        raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"Broker {replica_id} is not a replica of {part.name}: "
                         "a single node has no followers")


class ReplicatedPartitionAccess:
    """Cluster mode: the replica manager's roles, high watermarks and acknowledgements behind the same questions.
    Partitions are found by name in the replica manager (one dict lookup), never by reaching into the image on
    the hot path."""

    def __init__(self, replicas: ReplicaManager, image: MetadataImage) -> None:
        self._rm = replicas
        self._image = image

    def _replica(self, part: Partition) -> Replica | None:
        return self._rm.replicas.get((part.topic, part.index))

    def leader(self, topic: str, partition: int, current_leader_epoch: int = NO_EPOCH) -> Partition | ErrorCode:
        rep = self._rm.leader_replica(topic, partition, current_leader_epoch)
        return rep if isinstance(rep, ErrorCode) else rep.part

    def replica(self, topic: str, partition: int) -> Partition | ErrorCode:
        rep = self._rm.replicas.get((topic, partition))
        if rep is not None:
            return rep.part
        if self._image.assignment(topic, partition) is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return ErrorCode.NOT_LEADER_OR_FOLLOWER

    def leader_epoch(self, topic: str, partition: int) -> int:
        return self._rm.leader_epoch(topic, partition)

    def describe(self, topic: str, partition: int) -> PartitionView:
        state = self._image.partition(topic, partition)
        assignment = self._image.assignment(topic, partition)
        replicas = list(assignment.replicas) if assignment is not None else []
        offline = [r for r in replicas if not self._image.is_live(r)]
        if state is None:
            return PartitionView(-1, -1, replicas, [], offline)
        return PartitionView(state.leader, state.leader_epoch, replicas, list(state.isr), offline)

    def log_start_offset(self, part: Partition) -> int:
        rep = self._replica(part)
        return part.log.log_start_offset if rep is None else self._rm.client_log_start(rep)

    def check_append(self, part: Partition, acks: int) -> ErrorCode:
        rep = self._replica(part)
        return ErrorCode.NOT_LEADER_OR_FOLLOWER if rep is None else self._rm.check_append(rep, acks)

    async def wait_acks_all(self, part: Partition, end_offset: int, timeout_ms: int) -> None:
        rep = self._replica(part)
        if rep is None:
            raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{part.name} is not a replica here any more")
        await self._rm.wait_acks_all(rep, end_offset, timeout_ms)

    async def wait_log_start(self, part: Partition, offset: int, timeout_ms: int) -> int:
        rep = self._replica(part)
        if rep is None:
            raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{part.name} is not a replica here any more")
        return await self._rm.wait_log_start(rep, offset, timeout_ms)

    def end_offset_for_epoch(self, part: Partition, epoch: int) -> tuple[int, int]:
        return part.leader_epochs.end_offset_for(epoch, part.log.log_end_offset)

    def epoch_for_offset(self, part: Partition, offset: int) -> int:
        return part.leader_epochs.epoch_for_offset(offset)

    def offsets_available(self, part: Partition) -> bool:
        rep = self._replica(part)
        return rep is not None and self._rm.offsets_available(rep)

    def appended(self, part: Partition) -> None:
        self._rm.appended(part)

    def replica_fetch(self, part: Partition, replica_id: int, fetch_offset: int, log_start_offset: int,
                      broker_epoch: int = -1) -> ErrorCode | None:
        rep = self._replica(part)
        if rep is None:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return self._rm.follower_fetch(rep, replica_id, fetch_offset, log_start_offset, broker_epoch)

    async def producer_snapshot(self, part: Partition, replica_id: int) -> tuple[bytes, int, int]:
        rep = self._replica(part)
        if rep is None:
            raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{part.name} is not a replica here any more")
        return await self._rm.producer_snapshot(rep, replica_id)
