"""Fetch request decode and Fetch response encode, versions 4..12.

Kafka's JSON schema (FetchRequest.json / FetchResponse.json) is the spec; the
round-trip tests check these functions against kafka-python's schema-driven codec
for every version. v13+ identifies topics by UUID (KIP-516) and is not accepted.

The response encoder never touches record bytes. It returns the body as a list of
pieces: `bytes` it built itself (length prefixes, partition headers), interleaved
with the caller's records objects exactly as given, so the connection can write the
bytes and `sendfile` the file regions. Fetch responses are mostly records, so this is
what keeps a fetch from costing a copy of everything it returns.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .primitives import (
    EMPTY_TAGS,
    INT32,
    ProtocolError,
    Reader,
    UnsupportedVersionError,
    encode_compact_string,
    encode_string,
    encode_uvarint,
    skip_tags_at,
)

__all__ = [
    "MIN_VERSION",
    "MAX_VERSION",
    "FIRST_FLEXIBLE_VERSION",
    "FetchPartition",
    "FetchTopic",
    "ForgottenTopic",
    "FetchRequestData",
    "FetchPartitionResponse",
    "decode_fetch_request",
    "encode_replica_state_tag",
    "encode_fetch_response",
    "pieces_size",
]

MIN_VERSION = 4
MAX_VERSION = 12
FIRST_FLEXIBLE_VERSION = 12


class FetchPartition(NamedTuple):
    partition: int
    current_leader_epoch: int  # v9+, else -1
    fetch_offset: int
    last_fetched_epoch: int  # v12+, else -1
    log_start_offset: int  # v5+, else -1 (only meaningful from followers)
    partition_max_bytes: int


class FetchTopic(NamedTuple):
    name: str
    partitions: list[FetchPartition]


class ForgottenTopic(NamedTuple):
    name: str
    partitions: list[int]


@dataclass(slots=True)
class FetchRequestData:
    replica_id: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    isolation_level: int
    session_id: int = 0  # v7+
    session_epoch: int = -1  # v7+
    topics: list[FetchTopic] = field(default_factory=list)
    forgotten_topics: list[ForgottenTopic] = field(default_factory=list)  # v7+
    rack_id: str = ""  # v11+
    # The fetching broker's epoch (KIP-380), from a ReplicaState tagged field (Fetch v15's tag 1), which oncelog's
    # brokers also send at v12; -1 when absent (consumers, Kafka's brokers below v15).
    replica_epoch: int = -1


_HEAD_V4 = struct.Struct(">iiiib")  # replica, max wait, min bytes, max bytes, isolation
_HEAD_V7 = struct.Struct(">iiiibii")  # + session id, session epoch

# Fixed part of one partition, per version range.
_PART_V4 = struct.Struct(">iqi")  # partition, fetch offset, max bytes
_PART_V5 = struct.Struct(">iqqi")  # + log start offset
_PART_V9 = struct.Struct(">iiqqi")  # + current leader epoch (before fetch offset)
_PART_V12 = struct.Struct(">iiqiqi")  # + last fetched epoch (after fetch offset)


def _check_version(version: int) -> None:
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise UnsupportedVersionError(f"Fetch v{version} is not supported ({MIN_VERSION}-{MAX_VERSION})")


_new_tuple = tuple.__new__  # builds a NamedTuple without its Python-level __new__


def _read_partitions(r: Reader, version: int, count: int) -> list[FetchPartition]:
    """`count` partitions at the reader's position; the caller has checked they can fit.

    This is the per-partition loop of every fetch, so it works on the buffer directly:
    before v12 the partitions are a plain array of fixed-size structs and one
    `iter_unpack` reads them all; v12 interleaves a tagged-fields section, almost always
    the single byte 0.
    """
    buf = r.buf
    pos = r.pos
    if version >= 12:
        unpack = _PART_V12.unpack_from
        size = _PART_V12.size
        out: list[FetchPartition] = []
        add = out.append
        try:
            for _ in range(count):
                add(_new_tuple(FetchPartition, unpack(buf, pos)))
                pos += size
                if buf[pos]:
                    pos = skip_tags_at(buf, pos)
                else:
                    pos += 1
        except (IndexError, struct.error):
            raise ProtocolError(f"truncated partition at offset {pos}") from None
        r.pos = pos
        return out
    st = _PART_V9 if version >= 9 else _PART_V5 if version >= 5 else _PART_V4
    new = pos + count * st.size
    if new > r.end:
        raise ProtocolError(f"{count} partitions cannot fit in {r.end - pos} bytes")
    r.pos = new
    rows = st.iter_unpack(buf[pos:new])
    if version >= 9:
        return [_new_tuple(FetchPartition, (p, epoch, offset, -1, lso, mb)) for p, epoch, offset, lso, mb in rows]
    if version >= 5:
        return [_new_tuple(FetchPartition, (p, -1, offset, -1, lso, mb)) for p, offset, lso, mb in rows]
    return [_new_tuple(FetchPartition, (p, -1, offset, -1, -1, mb)) for p, offset, mb in rows]


def _read_int32_list(r: Reader, count: int) -> list[int]:
    st = struct.Struct(f">{count}i")
    return list(r.unpack(st))


REPLICA_STATE_TAG = 1
_REPLICA_STATE = struct.Struct(">iq")  # replica id, replica (broker) epoch


def _read_top_level_tags(r: Reader) -> int:
    """The request's top-level tagged fields: the ReplicaState's broker epoch if present (else -1); ClusterId and
    unknown tags skipped."""
    epoch = -1
    for _ in range(r.uvarint()):
        tag = r.uvarint()
        size = r.uvarint()
        start = r.pos
        if size > r.end - start:
            raise ProtocolError(f"tagged field {tag} of {size} bytes overruns the request")
        if tag == REPLICA_STATE_TAG and size >= _REPLICA_STATE.size:
            epoch = _REPLICA_STATE.unpack_from(r.buf, start)[1]
        r.pos = start + size
    return epoch


def encode_replica_state_tag(replica_id: int, replica_epoch: int) -> bytes:
    """The top-level tagged-fields section carrying a ReplicaState (Fetch v15's tag 1): what a follower puts in
    place of the empty section at the end of a flexible Fetch request."""
    payload = _REPLICA_STATE.pack(replica_id, replica_epoch) + EMPTY_TAGS
    return encode_uvarint(1) + encode_uvarint(REPLICA_STATE_TAG) + encode_uvarint(len(payload)) + payload


def decode_fetch_request(body: memoryview, version: int) -> FetchRequestData:
    """Decode a Fetch request body (the bytes after the request header).

    Tagged fields (v12: ClusterId at top level, any unknown tag anywhere) are skipped.
    Raises `ProtocolError` on malformation and trailing bytes, `UnsupportedVersionError`
    outside 4..12.
    """
    _check_version(version)
    r = Reader(body)
    flexible = version >= FIRST_FLEXIBLE_VERSION
    if version >= 7:
        replica_id, max_wait_ms, min_bytes, max_bytes, isolation, session_id, session_epoch = r.unpack(_HEAD_V7)
    else:
        replica_id, max_wait_ms, min_bytes, max_bytes, isolation = r.unpack(_HEAD_V4)
        session_id, session_epoch = 0, -1
    part_size = (_PART_V12.size + 1 if flexible else _PART_V9.size if version >= 9
                 else _PART_V5.size if version >= 5 else _PART_V4.size)
    topics: list[FetchTopic] = []
    forgotten: list[ForgottenTopic] = []
    rack_id = ""
    replica_epoch = -1
    if flexible:
        for _ in range(r.compact_array_len(3)):
            name = r.compact_string()
            partitions = _read_partitions(r, version, r.compact_array_len(part_size))
            r.skip_tags()
            topics.append(_new_tuple(FetchTopic, (name, partitions)))
        for _ in range(r.compact_array_len(3)):
            name = r.compact_string()
            indexes = _read_int32_list(r, r.compact_array_len(4))
            r.skip_tags()
            forgotten.append(ForgottenTopic(name, indexes))
        rack_id = r.compact_string()
        if r.pos < r.end and r.buf[r.pos] != 0:
            replica_epoch = _read_top_level_tags(r)
        else:
            r.skip_tags()
    else:
        for _ in range(r.array_len(6)):
            name = r.string()
            partitions = _read_partitions(r, version, r.array_len(part_size))
            topics.append(_new_tuple(FetchTopic, (name, partitions)))
        if version >= 7:
            for _ in range(r.array_len(6)):
                name = r.string()
                forgotten.append(ForgottenTopic(name, _read_int32_list(r, r.array_len(4))))
        if version >= 11:
            rack_id = r.string()
    r.expect_end("Fetch request")
    return FetchRequestData(
        replica_id, max_wait_ms, min_bytes, max_bytes, isolation,
        session_id, session_epoch, topics, forgotten, rack_id, replica_epoch,
    )


class FetchPartitionResponse(NamedTuple):
    """One partition's answer. Any tuple with these fields in this order is accepted.

    `records` is None, a bytes-like object, or anything with an integer `size`
    attribute (a file region); it is passed through to the piece list untouched.
    """

    partition_index: int
    error_code: int = 0
    high_watermark: int = -1
    last_stable_offset: int = -1  # v4+
    log_start_offset: int = -1  # v5+
    #: [(producer id, first offset)] or None, v4+; only READ_COMMITTED fetches need it
    aborted_transactions: Sequence[tuple[int, int]] | None = None
    preferred_read_replica: int = -1  # v11+
    records: Any = None
    #: v12+, to a follower replica: (epoch, end offset) where its log diverges from the leader's (DivergingEpoch,
    #: tag 0); None leaves the tag out. Tuples of the first eight fields alone are accepted too.
    diverging_epoch: tuple[int, int] | None = None


_R_V4 = struct.Struct(">ihqq")  # index, error, high watermark, last stable offset
_R_V5 = struct.Struct(">ihqqq")  # + log start offset
_R_V12_NO_ABORTED = struct.Struct(">ihqqqBi")  # v12 partition head when aborted is null: one pack
_ABORTED = struct.Struct(">qq")
_ABORTED_TAGGED = struct.Struct(">qqB")  # + empty tags, v12
_TOP_V7 = struct.Struct(">ihi")  # throttle, error, session id
_pack_i32 = INT32.pack
_REPLICA_LEN = struct.Struct(">ii")  # preferred read replica + records length, v11
_NULL_ARRAY = INT32.pack(-1)
_NULL_RECORDS_AND_TAGS = b"\x00\x00"  # v12: null compact records, then the partition's empty tags
_EMPTY_RECORDS_AND_TAGS = b"\x01\x00"  # v12: zero-length compact records, then empty tags
_BUFFERS = (bytes, bytearray, memoryview)


_DIVERGING = struct.Struct(">BBBiqB")  # one tag: tag 0, 13 bytes: epoch, end offset, the struct's empty tags


def _diverging_tag(diverging: tuple[int, int]) -> bytes:
    epoch, end_offset = diverging
    return _DIVERGING.pack(1, 0, 13, epoch, end_offset, 0)


def _records_size(records: Any) -> int:
    if isinstance(records, (bytes, bytearray)):
        return len(records)
    if isinstance(records, memoryview):
        return records.nbytes
    size = getattr(records, "size", None)
    if type(size) is not int:
        raise TypeError(f"records must be bytes-like or have an integer size, got {type(records).__name__}")
    return size


def encode_fetch_response(
    version: int,
    throttle_time_ms: int,
    error_code: int,
    session_id: int,
    topics: Sequence[tuple[str, Sequence[FetchPartitionResponse | tuple]]],
) -> list[Any]:
    """Encode a Fetch response body as a list of pieces to be written in order.

    Pieces are the codec's own `bytes` (adjacent ones joined, so there is one bytes
    piece between two records objects) and the caller's records objects, by identity.
    Empty bytes-like records are dropped (they own nothing); a file region is always
    passed on, even of size 0, because the piece list is how the caller finds the
    descriptors to close. `error_code` and `session_id` exist on the wire from v7 and are
    ignored below it. Of v12's partition tagged fields only DivergingEpoch is written (when
    given: answers to follower replicas); CurrentLeader and SnapshotId are left out.

    Plain tuples in `FetchPartitionResponse` order are accepted and are the cheapest
    thing to build on the hot path.
    """
    _check_version(version)
    if version >= 7:
        head = _TOP_V7.pack(throttle_time_ms, error_code, session_id)
    else:
        head = _pack_i32(throttle_time_ms)
    if version >= FIRST_FLEXIBLE_VERSION:
        return _encode_flexible(head, topics)
    return _encode_classic(version, head, topics)


def _encode_flexible(head: bytes, topics: Sequence[tuple[str, Sequence[Any]]]) -> list[Any]:
    # `cur` is the codec bytes since the last records object; it becomes one piece when
    # the next records object is emitted. bytes concatenation of a few dozen bytes is
    # cheaper here than collecting a list to join.
    pieces: list[Any] = []
    uvarint = encode_uvarint
    pack_head = _R_V12_NO_ABORTED.pack
    cur = head + uvarint(len(topics) + 1)
    for name, partitions in topics:
        cur += encode_compact_string(name) + uvarint(len(partitions) + 1)
        for p in partitions:
            if len(p) == 8:
                index, err, hw, lso, log_start, aborted, replica, records = p
                tags = EMPTY_TAGS
            else:
                index, err, hw, lso, log_start, aborted, replica, records, diverging = p
                tags = EMPTY_TAGS if diverging is None else _diverging_tag(diverging)
            if aborted is None:
                cur += pack_head(index, err, hw, lso, log_start, 0, replica)
            else:
                cur += b"".join([
                    _R_V5.pack(index, err, hw, lso, log_start),
                    uvarint(len(aborted) + 1),
                    *[_ABORTED_TAGGED.pack(producer_id, first_offset, 0) for producer_id, first_offset in aborted],
                    _pack_i32(replica),
                ])
            if records is None:
                cur += _NULL_RECORDS_AND_TAGS if tags is EMPTY_TAGS else b"\x00" + tags
                continue
            size = len(records) if type(records) is bytes else _records_size(records)
            if size or not isinstance(records, _BUFFERS):
                pieces.append(cur + uvarint(size + 1))
                pieces.append(records)
                cur = tags
            else:
                cur += _EMPTY_RECORDS_AND_TAGS if tags is EMPTY_TAGS else b"\x01" + tags
        cur += EMPTY_TAGS
    pieces.append(cur + EMPTY_TAGS)
    return pieces


def _encode_classic(version: int, head: bytes, topics: Sequence[tuple[str, Sequence[Any]]]) -> list[Any]:
    has_lso = version >= 5
    has_replica = version >= 11
    pieces: list[Any] = []
    cur = head + _pack_i32(len(topics))
    for name, partitions in topics:
        cur += encode_string(name) + _pack_i32(len(partitions))
        for p in partitions:
            index, err, hw, lso, log_start, aborted, replica, records = p if len(p) == 8 else p[:8]
            if has_lso:
                cur += _R_V5.pack(index, err, hw, lso, log_start)
            else:
                cur += _R_V4.pack(index, err, hw, lso)
            if aborted is None:
                cur += _NULL_ARRAY
            else:
                cur += b"".join([
                    _pack_i32(len(aborted)),
                    *[_ABORTED.pack(producer_id, first_offset) for producer_id, first_offset in aborted],
                ])
            size = -1 if records is None else len(records) if type(records) is bytes else _records_size(records)
            cur += _REPLICA_LEN.pack(replica, size) if has_replica else _pack_i32(size)
            if size > 0 or (size == 0 and not isinstance(records, _BUFFERS)):
                pieces.append(cur)
                pieces.append(records)
                cur = b""
    if cur:
        pieces.append(cur)
    return pieces


def pieces_size(pieces: Sequence[Any]) -> int:
    """Total byte length of a piece list, for the response's size prefix."""
    total = 0
    for p in pieces:
        if isinstance(p, (bytes, bytearray)):
            total += len(p)
        elif isinstance(p, memoryview):
            total += p.nbytes
        else:
            total += p.size
    return total
