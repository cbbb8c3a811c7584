"""The transaction log's record format, as Kafka writes `__transaction_state`.

Key (v0): int16 version, string transactional id. Value (v1, flexible): producer id,
epoch, timeout, state id, nullable compact array of (topic, [partition]), last update
and start timestamps, then tagged fields: 0 PreviousProducerId, 1 NextProducerId,
2 ClientTransactionVersion (Kafka's), and oncelog's tag 100 LastProducerEpoch, which
Kafka keeps only in memory (research §4.2). Kafka readers skip unknown tags, so the
records stay readable by Kafka's tools. A null value is a tombstone (expired id).
"""

from __future__ import annotations

import struct

from ...protocol.primitives import ProtocolError, Reader, encode_compact_string, encode_uvarint
from .metadata import TransactionMetadata, TxnState

KEY_VERSION = 0
VALUE_VERSION = 1
TAG_PREVIOUS_PRODUCER_ID = 0
TAG_NEXT_PRODUCER_ID = 1
TAG_CLIENT_TXN_VERSION = 2
TAG_LAST_PRODUCER_EPOCH = 100

_H = struct.Struct(">h")
_VALUE_HEAD = struct.Struct(">hqhib")
_TIMES = struct.Struct(">qq")
_Q = struct.Struct(">q")


def encode_key(transactional_id: str) -> bytes:
    raw = transactional_id.encode()
    return _H.pack(KEY_VERSION) + _H.pack(len(raw)) + raw


def decode_key(data: bytes) -> str:
    r = Reader(memoryview(data))
    version = r.int16()
    if version != KEY_VERSION:
        raise ProtocolError(f"unknown transaction log key version {version}")
    return r.string()


def encode_value(meta: TransactionMetadata) -> bytes:
    out = bytearray(_VALUE_HEAD.pack(VALUE_VERSION, meta.producer_id, meta.producer_epoch, meta.timeout_ms,
                                     int(meta.state)))
    if meta.state == TxnState.EMPTY and not meta.partitions:
        out += b"\x00"  # null array
    else:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(meta.partitions):
            by_topic.setdefault(topic, []).append(partition)
        out += encode_uvarint(len(by_topic) + 1)
        for topic, parts in by_topic.items():
            out += encode_compact_string(topic)
            out += encode_uvarint(len(parts) + 1)
            out += b"".join(struct.pack(">i", p) for p in parts)
            out += b"\x00"  # tags of the entry
    out += _TIMES.pack(meta.last_update_ms, meta.start_ms)
    tags = [
        (TAG_PREVIOUS_PRODUCER_ID, _Q.pack(meta.previous_producer_id)),
        (TAG_LAST_PRODUCER_EPOCH, _H.pack(meta.last_producer_epoch)),
    ]
    out += encode_uvarint(len(tags))
    for tag, payload in tags:
        out += encode_uvarint(tag) + encode_uvarint(len(payload)) + payload
    return bytes(out)


def decode_value(transactional_id: str, data: bytes) -> TransactionMetadata:
    r = Reader(memoryview(data))
    version = r.int16()
    if version not in (0, 1):
        raise ProtocolError(f"unknown transaction log value version {version}")
    producer_id = r.int64()
    epoch = r.int16()
    timeout = r.int32()
    state_id = r.int8()
    try:
        state = TxnState(state_id)
    except ValueError:
        raise ProtocolError(f"unknown transaction state {state_id}") from None
    partitions: set[tuple[str, int]] = set()
    count = r.compact_nullable_array_len() if version >= 1 else r.nullable_array_len()
    for _ in range(count or 0):
        topic = r.compact_string() if version >= 1 else r.string()
        n = r.compact_array_len() if version >= 1 else r.array_len()
        for _ in range(n):
            partitions.add((topic, r.int32()))
        if version >= 1:
            r.skip_tags()
    last_update = r.int64()
    start = r.int64()
    previous = -1
    last_epoch = -1
    if version >= 1:
        for _ in range(r.uvarint()):
            tag = r.uvarint()
            size = r.uvarint()
            payload = bytes(r._view(size))
            if tag == TAG_PREVIOUS_PRODUCER_ID and size == 8:
                previous = _Q.unpack(payload)[0]
            elif tag == TAG_LAST_PRODUCER_EPOCH and size == 2:
                last_epoch = _H.unpack(payload)[0]
    return TransactionMetadata(
        transactional_id=transactional_id, producer_id=producer_id, producer_epoch=epoch,
        last_producer_epoch=last_epoch, previous_producer_id=previous, timeout_ms=timeout, state=state,
        partitions=partitions, start_ms=start, last_update_ms=last_update,
    )
