"""Kafka's record formats in `__consumer_offsets`: offset commits and group metadata.

Keys and values are each prefixed with an int16 version, as Kafka writes them, so a
topic written by oncelog reads like one written by Kafka (and Kafka's own tools can
dump it). Key versions 0 and 1 are offset commits, 2 is group metadata; anything else
(KIP-848 consumer-group records, share groups) is not ours and is skipped on load.

Written versions are the ones Kafka 3.x/4.x writes: OffsetCommitValue v3 (v1 when the
commit carries an explicit expiry, OffsetCommit v2-4 `retention_time_ms`),
GroupMetadataValue v3. Every version 0-4 is read, including the flexible v4.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

OFFSET_KEY_VERSION = 1
GROUP_KEY_VERSION = 2
OFFSET_VALUE_VERSION = 3
OFFSET_VALUE_VERSION_WITH_EXPIRY = 1
GROUP_VALUE_VERSION = 3
MAX_VALUE_VERSION = 4  # the first flexible version of both values

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class RecordFormatError(ValueError):
    """A key or value that does not follow Kafka's schema (truncated, unknown version)."""


@dataclass(frozen=True, slots=True)
class OffsetKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupKey:
    group: str


@dataclass(slots=True)
class OffsetValue:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp: int = -1
    expire_timestamp: int = -1  # only in v1: an explicit per-commit expiry


@dataclass(slots=True)
class MemberValue:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout: int
    session_timeout: int
    subscription: bytes
    assignment: bytes


@dataclass(slots=True)
class GroupValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int = -1
    members: list[MemberValue] = field(default_factory=list)


# -- writing -------------------------------------------------------------------------------------------------
class _Writer:
    __slots__ = ("parts",)

    def __init__(self, version: int) -> None:
        self.parts: list[bytes] = [_I16.pack(version)]

    def int16(self, n: int) -> None:
        self.parts.append(_I16.pack(n))

    def int32(self, n: int) -> None:
        self.parts.append(_I32.pack(n))

    def int64(self, n: int) -> None:
        self.parts.append(_I64.pack(n))

    def string(self, text: str | None) -> None:
        if text is None:
            self.parts.append(_I16.pack(-1))
            return
        raw = text.encode("utf-8")
        if len(raw) > 0x7FFF:
            raise RecordFormatError(f"string of {len(raw)} bytes does not fit an int16 length")
        self.parts.append(_I16.pack(len(raw)))
        self.parts.append(raw)

    def bytes_(self, data: bytes) -> None:
        self.parts.append(_I32.pack(len(data)))
        self.parts.append(bytes(data))

    def done(self) -> bytes:
        return b"".join(self.parts)


def encode_offset_key(group: str, topic: str, partition: int) -> bytes:
    w = _Writer(OFFSET_KEY_VERSION)
    w.string(group)
    w.string(topic)
    w.int32(partition)
    return w.done()


def encode_group_key(group: str) -> bytes:
    w = _Writer(GROUP_KEY_VERSION)
    w.string(group)
    return w.done()


def encode_offset_value(value: OffsetValue) -> bytes:
    if value.expire_timestamp >= 0:
        w = _Writer(OFFSET_VALUE_VERSION_WITH_EXPIRY)
        w.int64(value.offset)
        w.string(value.metadata)
        w.int64(value.commit_timestamp)
        w.int64(value.expire_timestamp)
        return w.done()
    w = _Writer(OFFSET_VALUE_VERSION)
    w.int64(value.offset)
    w.int32(value.leader_epoch)
    w.string(value.metadata)
    w.int64(value.commit_timestamp)
    return w.done()


def encode_group_value(value: GroupValue) -> bytes:
    w = _Writer(GROUP_VALUE_VERSION)
    w.string(value.protocol_type)
    w.int32(value.generation)
    w.string(value.protocol)
    w.string(value.leader)
    w.int64(value.current_state_timestamp)
    w.int32(len(value.members))
    for m in value.members:
        w.string(m.member_id)
        w.string(m.group_instance_id)
        w.string(m.client_id)
        w.string(m.client_host)
        w.int32(m.rebalance_timeout)
        w.int32(m.session_timeout)
        w.bytes_(m.subscription)
        w.bytes_(m.assignment)
    return w.done()


# -- reading -------------------------------------------------------------------------------------------------
class _Reader:
    """Reads one schema; `flexible` switches strings, bytes and arrays to the compact forms of v4."""

    __slots__ = ("data", "pos", "flexible")

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = memoryview(data)
        self.pos = 0
        self.flexible = False

    def _take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise RecordFormatError("record is truncated")
        view = self.data[self.pos : self.pos + n]
        self.pos += n
        return view

    def int16(self) -> int:
        return _I16.unpack(self._take(2))[0]

    def int32(self) -> int:
        return _I32.unpack(self._take(4))[0]

    def int64(self) -> int:
        return _I64.unpack(self._take(8))[0]

    def uvarint(self) -> int:
        shift = result = 0
        while True:
            byte = self._take(1)[0]
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
            if shift > 28:
                raise RecordFormatError("varint is too long")

    def _length(self, wide: bool) -> int:
        if self.flexible:
            return self.uvarint() - 1
        return self.int32() if wide else self.int16()

    def nullable_string(self) -> str | None:
        n = self._length(False)
        if n < 0:
            return None
        try:
            return bytes(self._take(n)).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RecordFormatError(f"string is not UTF-8: {exc}") from None

    def string(self) -> str:
        text = self.nullable_string()
        if text is None:
            raise RecordFormatError("null where a string is required")
        return text

    def bytes_(self) -> bytes:
        n = self._length(True)
        if n < 0:
            raise RecordFormatError("null where bytes are required")
        return bytes(self._take(n))

    def array_length(self) -> int:
        n = self._length(True)
        if n < 0 or n > len(self.data):
            raise RecordFormatError(f"impossible array length {n}")
        return n

    def skip_tags(self) -> None:
        if not self.flexible:
            return
        for _ in range(self.uvarint()):
            self.uvarint()
            self._take(self.uvarint())


def decode_key(data: bytes | memoryview) -> OffsetKey | GroupKey | None:
    """The key of a `__consumer_offsets` record; None for record types that are not ours."""
    r = _Reader(data)
    version = r.int16()
    if version in (0, 1):
        return OffsetKey(r.string(), r.string(), r.int32())
    if version == GROUP_KEY_VERSION:
        return GroupKey(r.string())
    return None


def _value_reader(data: bytes | memoryview, what: str) -> tuple[_Reader, int]:
    r = _Reader(data)
    version = r.int16()
    if not 0 <= version <= MAX_VALUE_VERSION:
        raise RecordFormatError(f"unknown {what} value version {version}")
    r.flexible = version >= 4
    return r, version


def decode_offset_value(data: bytes | memoryview) -> OffsetValue:
    r, version = _value_reader(data, "offset commit")
    offset = r.int64()
    leader_epoch = r.int32() if version >= 3 else -1
    metadata = r.string()
    commit_timestamp = r.int64()
    expire_timestamp = r.int64() if version == 1 else -1
    r.skip_tags()
    return OffsetValue(offset, leader_epoch, metadata, commit_timestamp, expire_timestamp)


def decode_group_value(data: bytes | memoryview) -> GroupValue:
    r, version = _value_reader(data, "group metadata")
    protocol_type = r.string()
    generation = r.int32()
    protocol = r.nullable_string()
    leader = r.nullable_string()
    timestamp = r.int64() if version >= 2 else -1
    members = []
    for _ in range(r.array_length()):
        member_id = r.string()
        instance_id = r.nullable_string() if version >= 3 else None
        client_id = r.string()
        client_host = r.string()
        rebalance_timeout = r.int32() if version >= 1 else -1
        session_timeout = r.int32()
        if rebalance_timeout < 0:
            rebalance_timeout = session_timeout
        subscription = r.bytes_()
        assignment = r.bytes_()
        r.skip_tags()
        members.append(MemberValue(member_id, instance_id, client_id, client_host, rebalance_timeout,
                                   session_timeout, subscription, assignment))
    r.skip_tags()
    return GroupValue(protocol_type, generation, protocol, leader, timestamp, members)
