"""What the admin client returns: small frozen records, one per kind of answer.

They are plain data (no connection behind them), so the CLI can print them as tables or
as JSON (`as_dict`) and tests can compare them whole. Names follow the Java admin
client's where it has one (TopicDescription, ConfigEntry, ProducerState, ...).
"""

from __future__ import annotations

import base64
import dataclasses
import uuid
from dataclasses import dataclass
from typing import Any

__all__ = [
    "EARLIEST", "LATEST", "MAX_TIMESTAMP", "offset_spec",
    "READ_UNCOMMITTED", "READ_COMMITTED", "isolation_level",
    "RESOURCE_TOPIC", "RESOURCE_BROKER", "CONFIG_SOURCES",
    "kafka_uuid",
    "PartitionInfo", "TopicListing", "TopicDescription", "CreatedTopic", "ConfigEntry", "ListedOffset",
    "DeletedRecords", "GroupListing", "MemberDescription", "GroupDescription", "CommittedOffset",
    "OffsetReset", "ProducerState", "TransactionListing", "TransactionDescription", "HangingTransaction",
    "ClusterDescription",
]

# ListOffsets' special timestamps (Kafka's OffsetSpec)
LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
_SPECS = {"latest": LATEST, "earliest": EARLIEST, "max_timestamp": MAX_TIMESTAMP, "max-timestamp": MAX_TIMESTAMP}

READ_UNCOMMITTED = 0
READ_COMMITTED = 1
_ISOLATION = {"read_uncommitted": READ_UNCOMMITTED, "read_committed": READ_COMMITTED}

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4

# DescribeConfigs' ConfigSource numbers, by the Java client's enum names
CONFIG_SOURCES = {
    0: "UNKNOWN", 1: "DYNAMIC_TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG", 3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
    4: "STATIC_BROKER_CONFIG", 5: "DEFAULT_CONFIG", 6: "DYNAMIC_BROKER_LOGGER_CONFIG",
    7: "CLIENT_METRICS_CONFIG", 8: "GROUP_CONFIG",
}


def offset_spec(spec: str | int) -> int:
    """'earliest' / 'latest' / 'max_timestamp' or a timestamp in ms (>= 0) -> ListOffsets' timestamp field."""
    if isinstance(spec, str):
        if spec.lower() in _SPECS:
            return _SPECS[spec.lower()]
        try:
            spec = int(spec)
        except ValueError:
            raise ValueError(
                f"offset spec must be earliest, latest, max_timestamp or a timestamp, not {spec!r}") from None
    if spec < MAX_TIMESTAMP:
        raise ValueError(f"invalid offset spec {spec}")
    return spec


def isolation_level(level: str | int) -> int:
    if isinstance(level, int) and level in (READ_UNCOMMITTED, READ_COMMITTED):
        return level
    try:
        return _ISOLATION[str(level).lower()]
    except KeyError:
        raise ValueError(f"isolation level must be read_committed or read_uncommitted, not {level!r}") from None


def kafka_uuid(value: uuid.UUID | bytes | None) -> str | None:
    """A topic id as Kafka prints it (Uuid.toString: base64url, no padding); None for the zero id."""
    if value is None:
        return None
    raw = value.bytes if isinstance(value, uuid.UUID) else bytes(value)
    if not any(raw):
        return None
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class _Record:
    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: nested records become dicts, tuples become lists."""
        return _plain(dataclasses.asdict(self))  # type: ignore[call-overload]


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True)
class PartitionInfo(_Record):
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(frozen=True)
class TopicListing(_Record):
    name: str
    topic_id: str | None
    internal: bool
    partitions: int


@dataclass(frozen=True)
class ConfigEntry(_Record):
    name: str
    value: str | None
    source: str
    read_only: bool
    sensitive: bool
    #: (name, value, source) from the most specific to the default, when asked for
    synonyms: tuple[tuple[str, str | None, str], ...] = ()

    @property
    def is_default(self) -> bool:
        return self.source == "DEFAULT_CONFIG"


@dataclass(frozen=True)
class TopicDescription(_Record):
    name: str
    topic_id: str | None
    internal: bool
    partitions: tuple[PartitionInfo, ...]
    #: the topic's effective configs (None when not asked for)
    configs: dict[str, ConfigEntry] | None = None


@dataclass(frozen=True)
class CreatedTopic(_Record):
    name: str
    topic_id: str | None
    num_partitions: int
    replication_factor: int
    #: the new topic's effective configs, as CreateTopics v5+ returns them
    configs: dict[str, str | None]


@dataclass(frozen=True)
class ListedOffset(_Record):
    offset: int
    timestamp: int
    leader_epoch: int


@dataclass(frozen=True)
class DeletedRecords(_Record):
    low_watermark: int


@dataclass(frozen=True)
class GroupListing(_Record):
    group_id: str
    state: str
    protocol_type: str


@dataclass(frozen=True)
class MemberDescription(_Record):
    member_id: str
    group_instance_id: str | None
    client_id: str
    host: str
    #: the partitions the consumer protocol assigned to the member (empty for other protocols)
    assignment: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class GroupDescription(_Record):
    group_id: str
    state: str
    protocol_type: str
    protocol: str
    coordinator: int
    members: tuple[MemberDescription, ...]


@dataclass(frozen=True)
class CommittedOffset(_Record):
    offset: int
    leader_epoch: int
    metadata: str | None


@dataclass(frozen=True)
class OffsetReset(_Record):
    """One partition of a group offset reset: where the group was, where it goes."""

    topic: str
    partition: int
    current: int | None
    target: int


@dataclass(frozen=True)
class ProducerState(_Record):
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    #: first offset of the producer's open transaction on this partition, None when none is open
    current_txn_start_offset: int | None


@dataclass(frozen=True)
class TransactionListing(_Record):
    transactional_id: str
    producer_id: int
    state: str


@dataclass(frozen=True)
class TransactionDescription(_Record):
    transactional_id: str
    coordinator_id: int
    state: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    #: when the ongoing transaction started (None when there is none)
    start_time_ms: int | None
    partitions: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class HangingTransaction(_Record):
    """An open transaction on a partition that no coordinator will ever finish (see AsyncAdmin.find_hanging)."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    start_offset: int
    last_timestamp: int
    duration_ms: int
    #: why it is hanging: "unknown producer id", "unknown transactional id", "partition not in transaction"
    reason: str


@dataclass(frozen=True)
class ClusterDescription(_Record):
    cluster_id: str | None
    controller_id: int
    brokers: tuple[tuple[int, str, int], ...]
