"""Types the producer and the consumer share with users: TopicPartition, Message, offset sentinels.

The names and shapes are confluent-kafka's so that code can switch clients by changing an import.
A consumed record is the one object a consumer must build per record, so `Message` is a tuple
subclass built by C code (`tuple.__new__` mapped over the parser's output) and everything that is
the same for a whole batch (topic, partition, timestamp type, leader epoch) lives on a small
per-batch-kind subclass instead of in each instance.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = [
    "OFFSET_BEGINNING",
    "OFFSET_END",
    "OFFSET_STORED",
    "OFFSET_INVALID",
    "TIMESTAMP_NOT_AVAILABLE",
    "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_LOG_APPEND_TIME",
    "TopicPartition",
    "ConsumerGroupMetadata",
    "Message",
    "message_class",
    "error_message",
]

# confluent-kafka's logical offsets
OFFSET_BEGINNING = -2
OFFSET_END = -1
OFFSET_STORED = -1000
OFFSET_INVALID = -1001

# confluent-kafka's timestamp types (Message.timestamp()[0])
TIMESTAMP_NOT_AVAILABLE = 0
TIMESTAMP_CREATE_TIME = 1
TIMESTAMP_LOG_APPEND_TIME = 2

Headers = list[tuple[str, bytes | None]]


class TopicPartition:
    """A partition, and with it an offset (a position, a commit, a seek target) and per-partition error.

    Equality and hashing use (topic, partition) only, as in confluent-kafka, so TopicPartitions
    returned with offsets can be looked up in sets and dicts of plain partitions.
    """

    __slots__ = ("topic", "partition", "offset", "metadata", "leader_epoch", "error")

    def __init__(self, topic: str, partition: int = -1, offset: int = OFFSET_INVALID,
                 metadata: str | None = None, leader_epoch: int | None = None) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.metadata = metadata
        self.leader_epoch = leader_epoch
        self.error: Any = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TopicPartition):
            return NotImplemented
        return self.topic == other.topic and self.partition == other.partition

    def __lt__(self, other: TopicPartition) -> bool:
        return (self.topic, self.partition) < (other.topic, other.partition)

    def __hash__(self) -> int:
        return hash((self.topic, self.partition))

    def __repr__(self) -> str:
        extra = f", error={self.error!r}" if self.error is not None else ""
        epoch = f", leader_epoch={self.leader_epoch}" if self.leader_epoch is not None else ""
        return f"TopicPartition({self.topic!r}, {self.partition}, {self.offset}{epoch}{extra})"


class ConsumerGroupMetadata(NamedTuple):
    """A consumer's group membership as an offset commit must prove it (Consumer.consumer_group_metadata()).

    The producer's send_offsets_to_transaction sends these fields in TxnOffsetCommit, so the
    coordinator can refuse offsets from a member of an older generation (KIP-447).
    """

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None


class Message(tuple):
    """One consumed record: (offset, timestamp, key, value[, headers]) plus class-level batch facts.

    Never instantiate it directly; fetchers build it with `message_class(...)` and `error_message`.
    The accessors are methods, as in confluent-kafka. A batch without any header gives 4-tuples
    (and a class that says so): exact tuples of atomic values are untracked by the garbage
    collector, which matters while fetched records wait in the consumer's buffer.
    """

    __slots__ = ()
    _topic: str | None = None
    _partition: int = -1
    _timestamp_type: int = TIMESTAMP_NOT_AVAILABLE
    _leader_epoch: int | None = None
    _has_headers = True

    def topic(self) -> str | None:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self[0]

    def timestamp(self) -> tuple[int, int]:
        """(timestamp type, milliseconds since the epoch); type TIMESTAMP_NOT_AVAILABLE has -1."""
        return (self._timestamp_type, self[1])

    def key(self) -> bytes | None:
        return self[2]

    def value(self) -> bytes | None:
        return self[3]

    def headers(self) -> Headers | None:
        """The record's headers as (name, value) pairs, or None when it has none (confluent-kafka's shape)."""
        return (self[4] or None) if self._has_headers else None

    def leader_epoch(self) -> int | None:
        return self._leader_epoch

    def error(self) -> Any:
        return None

    def __len__(self) -> int:  # confluent-kafka: len(msg) is the value's length
        value = self[3]
        return 0 if value is None else len(value)

    def __repr__(self) -> str:
        error = self.error()
        tail = f"error={error!r}" if error is not None else f"key={self[2]!r}, value_len={len(self)}"
        return f"Message(topic={self.topic()!r}, partition={self.partition()}, offset={self[0]}, {tail})"

    def __bool__(self) -> bool:  # a message is truthy even with an empty value (len 0)
        return True


class _ErrorMessage(Message):
    """An event from poll(): a partition error or end-of-partition, as confluent-kafka delivers them."""

    __slots__ = ()

    def error(self) -> Any:
        return self[5]

    def topic(self) -> str | None:
        return self[6]

    def partition(self) -> int:
        return self[7]

    def timestamp(self) -> tuple[int, int]:
        return (TIMESTAMP_NOT_AVAILABLE, -1)


_classes: dict[tuple[str, int, int, int | None, bool], type[Message]] = {}
_MAX_CLASSES = 100_000


def message_class(topic: str, partition: int, timestamp_type: int, leader_epoch: int | None,
                  has_headers: bool = True) -> type[Message]:
    """The Message subclass carrying one batch kind's shared facts; cached, so a new one is rare.

    `has_headers`: its instances are 5-tuples ending with the headers list, else 4-tuples.
    """
    key = (topic, partition, timestamp_type, leader_epoch, has_headers)
    cls = _classes.get(key)
    if cls is None:
        if len(_classes) >= _MAX_CLASSES:
            _classes.clear()
        cls = type("Message", (Message,), {"__slots__": (), "_topic": topic, "_partition": partition,
                                            "_timestamp_type": timestamp_type, "_leader_epoch": leader_epoch,
                                            "_has_headers": has_headers})
        _classes[key] = cls
    return cls


def error_message(error: Any, topic: str | None = None, partition: int = -1, offset: int = OFFSET_INVALID) -> Message:
    """A Message whose error() is `error` (a KafkaError), for poll() to hand out like confluent-kafka does."""
    return tuple.__new__(_ErrorMessage, (offset, -1, None, None, None, error, topic, partition))
