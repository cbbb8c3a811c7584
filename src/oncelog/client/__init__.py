"""oncelog's Python Kafka client: an asyncio core with synchronous facades (docs/client-design.md).

Each module's owner adds its public names here as the module lands.
"""

from __future__ import annotations

from . import errors
from .admin import Admin, AsyncAdmin
from .config import ClientConfig
from .consumer import AsyncConsumer, CommitFailed, Consumer, OffsetResetError, PartitionEOF
from .errors import (
    AbortableError,
    DataLossError,
    FatalError,
    KafkaError,
    KafkaTimeoutError,
    NetworkError,
    ProducerFenced,
    RecordError,
    RequestTimedOut,
    RetriableError,
    UnsupportedVersion,
)
from .producer import AsyncProducer, DeliveryReport, Producer
from .types import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    OFFSET_STORED,
    ConsumerGroupMetadata,
    Message,
    TopicPartition,
)

__all__ = [
    "errors",
    "Admin",
    "AsyncAdmin",
    "ClientConfig",
    "KafkaError",
    "RetriableError",
    "AbortableError",
    "FatalError",
    "NetworkError",
    "RequestTimedOut",
    "UnsupportedVersion",
    "ProducerFenced",
    "DataLossError",
    "RecordError",
    "KafkaTimeoutError",
    "Producer",
    "AsyncProducer",
    "DeliveryReport",
    "Consumer",
    "AsyncConsumer",
    "PartitionEOF",
    "OffsetResetError",
    "CommitFailed",
    "TopicPartition",
    "Message",
    "ConsumerGroupMetadata",
    "OFFSET_BEGINNING",
    "OFFSET_END",
    "OFFSET_STORED",
    "OFFSET_INVALID",
]
