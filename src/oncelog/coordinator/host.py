"""What the coordinators need from the broker that hosts them.

The coordinators sit below `broker/`, so they name their host through these Protocols
instead of importing `broker.server.Broker`, which satisfies them structurally. Each
coordinator sees the other only through the one member it uses, so neither coordinator
module imports the other here either. A cluster-mode broker offers the same members.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from ..config import BrokerConfig
    from ..errors import ErrorCode
    from ..storage.flusher import GroupCommitFlusher
    from ..storage.log_manager import LogManager
    from ..storage.partition import Partition


class ProducerIdSource(Protocol):
    """Hands out producer ids that no earlier producer of this cluster had."""

    def next_id(self) -> int: ...


class TxnOffsetsSink(Protocol):
    """The group coordinator as the transaction coordinator sees it: transactional offsets of a
    producer become visible (commit) or are dropped (abort) once its marker is in `__consumer_offsets`."""

    def complete_txn(self, producer_id: int, commit: bool, partition: int | None = None) -> int: ...


class TransactionalIds(Protocol):
    """The transaction coordinator as the group coordinator sees it: which transactional id owns a
    producer id, so replayed offset commits are tied to their transaction."""

    @property
    def by_producer(self) -> Mapping[int, str]: ...


class PartitionLeadership(Protocol):
    """What each coordinator offers the broker: it serves the keys of a partition of its internal topic while this
    broker leads that partition (both coordinators ignore topics that are not theirs)."""

    def on_leadership(self, topic: str, partition: int, leader_epoch: int) -> None: ...

    def on_resignation(self, topic: str, partition: int) -> None: ...


class InternalPartitions(Protocol):
    """The broker's partition access (`broker.partition_access.PartitionAccess`) as far as the coordinators use
    it: their internal topics' partitions are written like any produce with acks=all, so that a coordinator's
    state is what its replicated log says, and a coordinator whose leadership moved cannot write."""

    def leader(self, topic: str, partition: int, current_leader_epoch: int = -1) -> Partition | ErrorCode:
        """The local partition if this broker leads it at `current_leader_epoch`, else the error to answer."""
        ...

    def leader_epoch(self, topic: str, partition: int) -> int:
        """The partition's leader epoch as this broker knows it; -1 when it knows no such partition."""
        ...

    def check_append(self, part: Partition, acks: int) -> ErrorCode:
        """NOT_ENOUGH_REPLICAS (acks=all below min.insync.replicas) or NOT_LEADER_OR_FOLLOWER before appending."""
        ...

    def wait_acks_all(self, part: Partition, end_offset: int, timeout_ms: int) -> Awaitable[None]:
        """Returns once every offset below `end_offset` is acknowledged as acks=all requires; raises KafkaError."""
        ...


class MarkerWriter(Protocol):
    """Cluster mode: markers for the partitions other brokers lead (WriteTxnMarkers to each leader, retried
    across leader changes); the answer per partition is NONE when written (or the topic is gone), a final
    refusal, or REQUEST_TIMED_OUT when it could not be written before `timeout_s`."""

    async def write(self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                    partitions: Iterable[tuple[str, int]], timeout_s: float) -> dict[tuple[str, int], ErrorCode]: ...


class MetricsRegistry(Protocol):
    """The broker's metrics, as far as a coordinator adds its own to them."""

    @property
    def registry(self) -> CollectorRegistry: ...


class TransactionHost(Protocol):
    """What `TransactionCoordinator` takes from its broker."""

    @property
    def config(self) -> BrokerConfig: ...
    @property
    def logs(self) -> LogManager: ...
    @property
    def flusher(self) -> GroupCommitFlusher: ...
    @property
    def partitions(self) -> InternalPartitions: ...
    @property
    def producer_ids(self) -> ProducerIdSource: ...
    @property
    def group_coordinator(self) -> TxnOffsetsSink | None: ...
    @property
    def marker_channel(self) -> MarkerWriter | None:
        """None on the single node, which leads every partition."""
        ...


class GroupHost(Protocol):
    """What `GroupCoordinator.for_broker` takes from its broker."""

    @property
    def config(self) -> BrokerConfig: ...
    @property
    def logs(self) -> LogManager: ...
    @property
    def flusher(self) -> GroupCommitFlusher: ...
    @property
    def partitions(self) -> InternalPartitions: ...
    @property
    def metrics(self) -> MetricsRegistry: ...
    @property
    def txn_coordinator(self) -> TransactionalIds | None: ...
