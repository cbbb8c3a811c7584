"""What the coordinators need from the broker that hosts them.

The coordinators sit below `broker/`, so they name their host through these Protocols
instead of importing `broker.server.Broker`, which satisfies them structurally. Each
coordinator sees the other only through the one member it uses, so neither coordinator
module imports the other here either. A cluster-mode broker offers the same members.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from ..config import BrokerConfig
    from ..storage.flusher import GroupCommitFlusher
    from ..storage.log_manager import LogManager


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
    def producer_ids(self) -> ProducerIdSource: ...
    @property
    def group_coordinator(self) -> TxnOffsetsSink | None: ...


class GroupHost(Protocol):
    """What `GroupCoordinator.for_broker` takes from its broker."""

    @property
    def config(self) -> BrokerConfig: ...
    @property
    def logs(self) -> LogManager: ...
    @property
    def flusher(self) -> GroupCommitFlusher: ...
    @property
    def metrics(self) -> MetricsRegistry: ...
    @property
    def txn_coordinator(self) -> TransactionalIds | None: ...
