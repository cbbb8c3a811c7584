"""Client-direction codecs: encode requests, decode responses.

The mirror image of the broker's codecs. The long tail goes through kafka-python's
schema classes (via `messages`, so the library stays behind one module); Produce
and Fetch, the two APIs a client sends thousands of times a second, are written by
hand over `primitives`: a Produce request is returned as a list of pieces with each
record batch passed through by identity (the connection writes them with one
``writelines``, nothing is copied into a request buffer), and a Fetch response hands
back each partition's records as a memoryview slice of the response frame.

Versions: Produce 3..11 and Fetch 4..12, the ranges the broker advertises
(`apis.SPECS`); the client picks the highest version both sides speak.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

from . import fetch_codec, produce_codec
from .apis import ApiKey
from .messages import REQUESTS, RESPONSES
from .messages import _build as build_message
from .primitives import (
    EMPTY_TAGS,
    INT16,
    INT32,
    ProtocolError,
    Reader,
    UnsupportedVersionError,
    as_memoryview,
    encode_compact_nullable_string,
    encode_compact_string,
    encode_nullable_string,
    encode_string,
    encode_uvarint,
    skip_tags_at,
)

__all__ = [
    "PRODUCE_VERSIONS",
    "FETCH_VERSIONS",
    "request_flexible",
    "response_flexible",
    "encode_request",
    "decode_response",
    "encode_request_header",
    "response_body_offset",
    "ProducePartitionResult",
    "ProduceTopicResult",
    "encode_produce_request",
    "decode_produce_response",
    "FetchedPartition",
    "FetchResult",
    "encode_fetch_request",
    "decode_fetch_response",
]

PRODUCE_VERSIONS = (produce_codec.MIN_VERSION, produce_codec.MAX_VERSION)
FETCH_VERSIONS = (fetch_codec.MIN_VERSION, fetch_codec.MAX_VERSION)


# -- headers and the long tail --------------------------------------------------------------------


_FLEXIBLE: dict[tuple[int, int], bool] = {}


def request_flexible(api_key: int, version: int) -> bool:
    """Whether this request uses header v2 and compact encodings (from the schema, so any API works).

    Memoised: it is asked twice per request (header out, header in).
    """
    flexible = _FLEXIBLE.get((api_key, version))
    if flexible is None:
        cls = REQUESTS.get(api_key)
        if cls is None:
            raise UnsupportedVersionError(f"no codec for API key {api_key}")
        flexible = _FLEXIBLE[(api_key, version)] = bool(cls.flexible_version_q(version))
    return flexible


def response_flexible(api_key: int, version: int) -> bool:
    """Whether the response header carries a tagged-fields section.

    ApiVersions answers with header v0 at every version, so that a client that guessed
    a version too high can still read the broker's error.
    """
    return api_key != ApiKey.API_VERSIONS and request_flexible(api_key, version)


_HEADER = struct.Struct(">hhi")


def encode_request_header(api_key: int, version: int, correlation_id: int, client_id: str | None) -> bytes:
    """Request header v1, or v2 (an empty tagged-fields section added) for flexible versions.

    The client id is a classic int16 string in both: the broker must read the header
    before it knows whether it understands the version.
    """
    head = _HEADER.pack(api_key, version, correlation_id) + encode_nullable_string(client_id)
    if request_flexible(api_key, version):
        return head + EMPTY_TAGS
    return head


def response_body_offset(api_key: int, version: int, frame: bytes | bytearray | memoryview) -> int:
    """Where the body starts in a response frame (size prefix already removed): after the
    correlation id and, for flexible responses, the header's tagged fields."""
    if len(frame) < 4:
        raise ProtocolError(f"response of {len(frame)} bytes has no correlation id")
    if not response_flexible(api_key, version):
        return 4
    mv = as_memoryview(frame)
    if len(mv) > 4 and mv[4] == 0:
        return 5
    return skip_tags_at(mv, 4)


def encode_request(api_key: int, version: int, data: dict[str, Any]) -> bytes:
    """A request body (no header) from a dict of snake_case schema fields; unset fields take
    the schema's defaults. Nested structs are dicts, arrays of structs lists of dicts."""
    cls = REQUESTS.get(api_key)
    if cls is None:
        raise UnsupportedVersionError(f"no codec for API key {api_key}")
    if not cls.min_version <= version <= cls.max_version:
        raise UnsupportedVersionError(f"{cls.__name__} v{version} is outside {cls.min_version}..{cls.max_version}")
    return bytes(build_message(cls[version], data).encode(version=version))


def decode_response(api_key: int, version: int, body: bytes | bytearray | memoryview) -> Any:
    """A response body as kafka-python's response object (fields by snake_case attribute)."""
    cls = RESPONSES.get(api_key)
    if cls is None:
        raise UnsupportedVersionError(f"no codec for API key {api_key}")
    try:
        return cls.decode(as_memoryview(body), version=version)
    except ProtocolError:
        raise
    except Exception as exc:  # the library raises IndexError/ValueError/struct.error on bad input
        raise ProtocolError(f"malformed {cls.__name__} v{version}: {exc!r}") from None


# -- Produce --------------------------------------------------------------------------------------

_ACKS_TIMEOUT = struct.Struct(">hi")
_INDEX_LEN = struct.Struct(">ii")
_pack_i32 = INT32.pack

Records = bytes | bytearray | memoryview


def _check_produce_version(version: int) -> None:
    if not produce_codec.MIN_VERSION <= version <= produce_codec.MAX_VERSION:
        raise UnsupportedVersionError(
            f"Produce v{version} is not supported ({produce_codec.MIN_VERSION}-{produce_codec.MAX_VERSION})")


def encode_produce_request(
    version: int,
    transactional_id: str | None,
    acks: int,
    timeout_ms: int,
    topics: Sequence[tuple[str, Sequence[tuple[int, Records]]]],
) -> list[bytes | memoryview]:
    """A Produce request body as pieces: codec bytes interleaved with the callers' record batches,
    by identity. ``b"".join(pieces)`` is the body; a connection writes the pieces as they are."""
    _check_produce_version(version)
    pieces: list[Any] = []
    add = pieces.append
    if version >= produce_codec.FIRST_FLEXIBLE_VERSION:
        uvarint = encode_uvarint
        cur = encode_compact_nullable_string(transactional_id) + _ACKS_TIMEOUT.pack(acks, timeout_ms)
        cur += uvarint(len(topics) + 1)
        for name, partitions in topics:
            cur += encode_compact_string(name) + uvarint(len(partitions) + 1)
            for index, records in partitions:
                size = records.nbytes if isinstance(records, memoryview) else len(records)
                add(cur + _pack_i32(index) + uvarint(size + 1))
                add(records)
                cur = EMPTY_TAGS  # the partition's tags
            cur += EMPTY_TAGS  # the topic's tags
        add(cur + EMPTY_TAGS)
        return pieces
    cur = encode_nullable_string(transactional_id) + _ACKS_TIMEOUT.pack(acks, timeout_ms) + _pack_i32(len(topics))
    for name, partitions in topics:
        cur += encode_string(name) + _pack_i32(len(partitions))
        for index, records in partitions:
            size = records.nbytes if isinstance(records, memoryview) else len(records)
            add(cur + _INDEX_LEN.pack(index, size))
            add(records)
            cur = b""
    if cur:
        add(cur)
    return pieces


class ProducePartitionResult(NamedTuple):
    partition: int
    error_code: int
    base_offset: int
    log_append_time: int
    #: v5+, else -1; seed 004: with UNKNOWN_PRODUCER_ID it tells retention from data loss
    log_start_offset: int
    #: v8+ (KIP-467): [(batch index, message or None)] of the records that sank the batch
    record_errors: list[tuple[int, str | None]]
    error_message: str | None


class ProduceTopicResult(NamedTuple):
    name: str
    partitions: list[ProducePartitionResult]


_P_V3 = struct.Struct(">ihqq")
_P_V5 = struct.Struct(">ihqqq")
_new_tuple = tuple.__new__


def decode_produce_response(version: int, body: bytes | bytearray | memoryview) -> list[ProduceTopicResult]:
    """The per-partition results of a Produce response, versions 3..11 (throttle time is dropped:
    oncelog does not throttle, and a client that is told to slow down by a broker retries anyway)."""
    _check_produce_version(version)
    r = Reader(body)
    try:
        if version >= produce_codec.FIRST_FLEXIBLE_VERSION:
            topics = _decode_produce_flexible(r)
        else:
            topics = _decode_produce_classic(r, version)
    except (IndexError, struct.error):
        raise ProtocolError(f"truncated Produce v{version} response") from None
    return topics


def _decode_produce_flexible(r: Reader) -> list[ProduceTopicResult]:
    topics: list[ProduceTopicResult] = []
    for _ in range(r.compact_array_len(3)):
        name = r.compact_string()
        partitions: list[ProducePartitionResult] = []
        for _ in range(r.compact_array_len(_P_V5.size + 3)):
            index, error_code, base_offset, append_time, log_start = r.unpack(_P_V5)
            record_errors: list[tuple[int, str | None]] = []
            for _ in range(r.compact_array_len(6)):
                batch_index = r.int32()
                record_errors.append((batch_index, r.compact_nullable_string()))
                r.skip_tags()
            message = r.compact_nullable_string()
            r.skip_tags()  # v10+: CurrentLeader; a single broker never moves leaders
            partitions.append(_new_tuple(ProducePartitionResult, (
                index, error_code, base_offset, append_time, log_start, record_errors, message)))
        r.skip_tags()
        topics.append(ProduceTopicResult(name, partitions))
    r.int32()  # throttle time
    r.skip_tags()  # v10+: NodeEndpoints
    r.expect_end("Produce response")
    return topics


def _decode_produce_classic(r: Reader, version: int) -> list[ProduceTopicResult]:
    topics: list[ProduceTopicResult] = []
    st = _P_V5 if version >= 5 else _P_V3
    for _ in range(r.array_len(6)):
        name = r.string()
        partitions: list[ProducePartitionResult] = []
        for _ in range(r.array_len(st.size)):
            if version >= 5:
                index, error_code, base_offset, append_time, log_start = r.unpack(st)
            else:
                index, error_code, base_offset, append_time = r.unpack(st)
                log_start = -1
            record_errors: list[tuple[int, str | None]] = []
            message = None
            if version >= 8:
                for _ in range(r.array_len(6)):
                    batch_index = r.int32()
                    record_errors.append((batch_index, r.nullable_string()))
                message = r.nullable_string()
            partitions.append(_new_tuple(ProducePartitionResult, (
                index, error_code, base_offset, append_time, log_start, record_errors, message)))
        topics.append(ProduceTopicResult(name, partitions))
    r.int32()  # throttle time
    r.expect_end("Produce response")
    return topics


# -- Fetch ----------------------------------------------------------------------------------------

_F_HEAD_V4 = struct.Struct(">iiiib")  # replica id, max wait, min bytes, max bytes, isolation level
_F_HEAD_V7 = struct.Struct(">iiiibii")  # + session id, session epoch
_F_PART_V4 = struct.Struct(">iqi")  # partition, fetch offset, partition max bytes
_F_PART_V5 = struct.Struct(">iqqi")  # + log start offset (followers only: -1)
_F_PART_V9 = struct.Struct(">iiqqi")  # + current leader epoch, before the fetch offset
_F_PART_V12 = struct.Struct(">iiqiqiB")  # + last fetched epoch after the fetch offset, + empty tags
_CONSUMER_REPLICA_ID = -1
_NO_SESSION = (0, -1)  # session id 0 with epoch -1: a full fetch that opens no session (KIP-227)
_EMPTY_ARRAY = INT32.pack(0)
_EMPTY_STRING = INT16.pack(0)


def _check_fetch_version(version: int) -> None:
    if not fetch_codec.MIN_VERSION <= version <= fetch_codec.MAX_VERSION:
        raise UnsupportedVersionError(
            f"Fetch v{version} is not supported ({fetch_codec.MIN_VERSION}-{fetch_codec.MAX_VERSION})")


def encode_fetch_request(
    version: int,
    *,
    max_wait_ms: int,
    min_bytes: int,
    max_bytes: int,
    isolation_level: int,
    topics: Sequence[tuple[str, Sequence[tuple[int, int, int]]]],
) -> bytes:
    """A full Fetch request body (no fetch session) for versions 4..12.

    `topics` is [(name, [(partition, fetch offset, partition max bytes)])];
    `isolation_level` is 0 (read_uncommitted) or 1 (read_committed). Leader epochs are
    sent as -1 (unknown), which a broker takes as "do not check".
    """
    _check_fetch_version(version)
    out: list[bytes] = []
    add = out.append
    if version >= 7:
        add(_F_HEAD_V7.pack(_CONSUMER_REPLICA_ID, max_wait_ms, min_bytes, max_bytes, isolation_level, *_NO_SESSION))
    else:
        add(_F_HEAD_V4.pack(_CONSUMER_REPLICA_ID, max_wait_ms, min_bytes, max_bytes, isolation_level))
    if version >= fetch_codec.FIRST_FLEXIBLE_VERSION:
        uvarint = encode_uvarint
        pack = _F_PART_V12.pack
        add(uvarint(len(topics) + 1))
        for name, partitions in topics:
            add(encode_compact_string(name))
            add(uvarint(len(partitions) + 1))
            add(b"".join([pack(p, -1, offset, -1, -1, limit, 0) for p, offset, limit in partitions]))
            add(EMPTY_TAGS)
        add(b"\x01")  # forgotten topics: empty compact array
        add(b"\x01")  # rack id: empty compact string
        add(EMPTY_TAGS)
        return b"".join(out)
    add(_pack_i32(len(topics)))
    for name, partitions in topics:
        add(encode_string(name))
        add(_pack_i32(len(partitions)))
        if version >= 9:
            pack = _F_PART_V9.pack
            add(b"".join([pack(p, -1, offset, -1, limit) for p, offset, limit in partitions]))
        elif version >= 5:
            pack = _F_PART_V5.pack
            add(b"".join([pack(p, offset, -1, limit) for p, offset, limit in partitions]))
        else:
            pack = _F_PART_V4.pack
            add(b"".join([pack(p, offset, limit) for p, offset, limit in partitions]))
    if version >= 7:
        add(_EMPTY_ARRAY)  # forgotten topics
    if version >= 11:
        add(_EMPTY_STRING)  # rack id
    return b"".join(out)


class FetchedPartition(NamedTuple):
    partition: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    #: [(producer id, first offset)] for read_committed fetches, else None
    aborted_transactions: list[tuple[int, int]] | None
    #: a slice of the response frame (empty when the broker sent none): record batches, possibly
    #: ending with a partial batch the client must drop
    records: memoryview
    #: v12+, to follower replicas: (epoch, end offset) where the follower's log diverges from the leader's
    diverging_epoch: tuple[int, int] | None = None


class FetchResult(NamedTuple):
    error_code: int
    throttle_time_ms: int
    topics: list[tuple[str, list[FetchedPartition]]]


_R_V4 = struct.Struct(">ihqq")  # partition, error, high watermark, last stable offset
_R_V5 = struct.Struct(">ihqqq")  # + log start offset
_ABORTED = struct.Struct(">qq")
_TOP_V7 = struct.Struct(">ihi")  # throttle, error, session id


_DIVERGING = struct.Struct(">iq")  # DivergingEpoch: epoch, end offset (then the struct's own tags)


def _partition_tags(r: Reader) -> tuple[int, int] | None:
    """A v12 fetch partition's tagged fields: DivergingEpoch (tag 0) if present and not its default -1/-1."""
    buf, pos = r.buf, r.pos
    if pos < r.end and buf[pos] == 0:  # no tags: almost always
        r.pos = pos + 1
        return None
    diverging = None
    for _ in range(r.uvarint()):
        tag, size = r.uvarint(), r.uvarint()
        end = r.pos + size
        if end > r.end:
            raise ProtocolError("tagged field runs past the end of the response")
        if tag == 0 and size >= _DIVERGING.size:
            epoch, end_offset = _DIVERGING.unpack_from(r.buf, r.pos)
            if (epoch, end_offset) != (-1, -1):
                diverging = (epoch, end_offset)
        r.pos = end
    return diverging


def decode_fetch_response(version: int, body: bytes | bytearray | memoryview) -> FetchResult:
    """A Fetch response, versions 4..12; records stay in the caller's buffer."""
    _check_fetch_version(version)
    r = Reader(body)
    if version >= 7:
        throttle, error_code, _session_id = r.unpack(_TOP_V7)
    else:
        throttle, error_code = r.int32(), 0
    flexible = version >= fetch_codec.FIRST_FLEXIBLE_VERSION
    topics: list[tuple[str, list[FetchedPartition]]] = []
    empty = r.buf[0:0]
    part = _R_V5 if version >= 5 else _R_V4
    if flexible:
        for _ in range(r.compact_array_len(3)):
            name = r.compact_string()
            partitions: list[FetchedPartition] = []
            for _ in range(r.compact_array_len(part.size + 7)):
                index, err, hw, lso, log_start = r.unpack(part)
                n = r.compact_nullable_array_len(_ABORTED.size + 1)
                aborted = None
                if n is not None:
                    aborted = []
                    for _ in range(n):
                        aborted.append(r.unpack(_ABORTED))
                        r.skip_tags()
                r.int32()  # preferred read replica
                records = r.compact_nullable_bytes()
                diverging = _partition_tags(r)  # DivergingEpoch; CurrentLeader, SnapshotId skipped
                partitions.append(_new_tuple(FetchedPartition, (
                    index, err, hw, lso, log_start, aborted, empty if records is None else records, diverging)))
            r.skip_tags()
            topics.append((name, partitions))
        r.skip_tags()  # NodeEndpoints
    else:
        for _ in range(r.array_len(6)):
            name = r.string()
            partitions = []
            for _ in range(r.array_len(part.size + 8)):
                if version >= 5:
                    index, err, hw, lso, log_start = r.unpack(part)
                else:
                    index, err, hw, lso = r.unpack(part)
                    log_start = -1
                n = r.nullable_array_len(_ABORTED.size)
                aborted = None if n is None else [r.unpack(_ABORTED) for _ in range(n)]
                if version >= 11:
                    r.int32()  # preferred read replica
                records = r.nullable_bytes()
                partitions.append(_new_tuple(FetchedPartition, (
                    index, err, hw, lso, log_start, aborted, empty if records is None else records, None)))
            topics.append((name, partitions))
    r.expect_end("Fetch response")
    return FetchResult(error_code, throttle, topics)
