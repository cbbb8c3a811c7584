"""Kafka's ConsumerProtocol: the subscription and assignment bytes carried by JoinGroup and SyncGroup.

Every consumer of a group reads the other members' bytes (the leader decodes all
subscriptions, every member decodes its assignment), so librdkafka and Java members can only
share a group with ours if these bytes follow Kafka's schemas exactly
(ConsumerProtocolSubscription / ConsumerProtocolAssignment, non-flexible encodings).

Newer versions only append fields, and Kafka reads a newer version by its known prefix; the
decoders here do the same, so a member speaking a future version still joins.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

CONSUMER_PROTOCOL_TYPE = "consumer"
SUBSCRIPTION_VERSION = 1  # v1 adds the owned partitions; v2's generation and v3's rack only matter to KIP-429/881
ASSIGNMENT_VERSION = 0

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class ConsumerProtocolError(ValueError):
    """Subscription or assignment bytes that do not follow the schema."""


@dataclass
class Subscription:
    topics: list[str]
    user_data: bytes | None = None
    owned_partitions: dict[str, list[int]] = field(default_factory=dict)
    generation_id: int = -1
    rack_id: str | None = None


@dataclass
class Assignment:
    partitions: dict[str, list[int]]
    user_data: bytes | None = None


def encode_subscription(sub: Subscription, version: int = SUBSCRIPTION_VERSION) -> bytes:
    out = [_I16.pack(version), _string_array(sub.topics), _bytes(sub.user_data)]
    if version >= 1:
        out.append(_topic_partitions(sub.owned_partitions))
    if version >= 2:
        out.append(_I32.pack(sub.generation_id))
    if version >= 3:
        out.append(_string(sub.rack_id))
    return b"".join(out)


def decode_subscription(data: bytes | memoryview) -> Subscription:
    r = _Reader(data)
    version = r.i16()
    if version < 0:
        raise ConsumerProtocolError(f"subscription version {version} is negative")
    sub = Subscription(topics=r.string_array(), user_data=r.nullable_bytes())
    # Fields of later versions are read only when present: some clients announce v1+ but stop early.
    if version >= 1 and r.remaining():
        sub.owned_partitions = r.topic_partitions()
    if version >= 2 and r.remaining() >= 4:
        sub.generation_id = r.i32()
    if version >= 3 and r.remaining() >= 2:
        sub.rack_id = r.nullable_string()
    return sub


def encode_assignment(assignment: Assignment, version: int = ASSIGNMENT_VERSION) -> bytes:
    return b"".join([_I16.pack(version), _topic_partitions(assignment.partitions), _bytes(assignment.user_data)])


def decode_assignment(data: bytes | memoryview | None) -> Assignment:
    """An empty buffer is an empty assignment: Kafka's coordinator sends that to members the leader left out."""
    if data is None or len(data) == 0:
        return Assignment({})
    r = _Reader(data)
    version = r.i16()
    if version < 0:
        raise ConsumerProtocolError(f"assignment version {version} is negative")
    partitions = r.topic_partitions()
    user_data = r.nullable_bytes() if r.remaining() >= 4 else None
    return Assignment(partitions, user_data)


def _string(s: str | None) -> bytes:
    if s is None:
        return _I16.pack(-1)
    raw = s.encode("utf-8")
    return _I16.pack(len(raw)) + raw


def _bytes(b: bytes | None) -> bytes:
    if b is None:
        return _I32.pack(-1)
    return _I32.pack(len(b)) + bytes(b)


def _string_array(items: Iterable[str]) -> bytes:
    items = list(items)
    return _I32.pack(len(items)) + b"".join(_string(s) for s in items)


def _topic_partitions(parts: Mapping[str, Iterable[int]]) -> bytes:
    out = [_I32.pack(len(parts))]
    for topic in sorted(parts):
        ps = list(parts[topic])
        out.append(_string(topic))
        out.append(_I32.pack(len(ps)))
        out.append(struct.pack(f">{len(ps)}i", *ps))
    return b"".join(out)


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, data: bytes | memoryview) -> None:
        self.buf = bytes(data)
        self.pos = 0

    def remaining(self) -> int:
        return len(self.buf) - self.pos

    def _need(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise ConsumerProtocolError(f"truncated at byte {self.pos}: {n} more bytes expected")

    def i16(self) -> int:
        self._need(2)
        (v,) = _I16.unpack_from(self.buf, self.pos)
        self.pos += 2
        return v

    def i32(self) -> int:
        self._need(4)
        (v,) = _I32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def nullable_string(self) -> str | None:
        n = self.i16()
        if n < 0:
            return None
        self._need(n)
        try:
            s = self.buf[self.pos : self.pos + n].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConsumerProtocolError(f"string at byte {self.pos} is not UTF-8") from exc
        self.pos += n
        return s

    def string(self) -> str:
        s = self.nullable_string()
        if s is None:
            raise ConsumerProtocolError(f"null string at byte {self.pos}")
        return s

    def nullable_bytes(self) -> bytes | None:
        n = self.i32()
        if n < 0:
            return None
        self._need(n)
        b = self.buf[self.pos : self.pos + n]
        self.pos += n
        return b

    def count(self) -> int:
        n = self.i32()
        if n < 0:
            return 0
        if n > len(self.buf):
            raise ConsumerProtocolError(f"array of {n} items in {len(self.buf)} bytes")
        return n

    def string_array(self) -> list[str]:
        return [self.string() for _ in range(self.count())]

    def topic_partitions(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for _ in range(self.count()):
            topic = self.string()
            n = self.count()
            self._need(4 * n)
            out.setdefault(topic, []).extend(struct.unpack_from(f">{n}i", self.buf, self.pos))
            self.pos += 4 * n
        return out
