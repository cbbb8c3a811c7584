"""The `__transaction_state` record format: Kafka's key/value layout (research §6.2), bytes built by hand
here, plus oncelog's tagged LastProducerEpoch, and a round trip of every persisted field."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncelog.coordinator.txn.log_format import decode_key, decode_value, encode_key, encode_value
from oncelog.coordinator.txn.metadata import TransactionMetadata, TxnState
from oncelog.protocol.primitives import ProtocolError


def uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def kafka_v0_value(
    pid: int,
    epoch: int,
    timeout: int,
    state: int,
    parts: dict[str, list[int]] | None,
    updated: int,
    started: int,
) -> bytes:
    """TransactionLogValue v0 as Kafka writes it (not flexible)."""
    out = struct.pack(">hqhib", 0, pid, epoch, timeout, state)
    if parts is None:
        out += struct.pack(">i", -1)
    else:
        out += struct.pack(">i", len(parts))
        for topic, ps in parts.items():
            out += struct.pack(">h", len(topic)) + topic.encode() + struct.pack(">i", len(ps))
            out += b"".join(struct.pack(">i", p) for p in ps)
    return out + struct.pack(">qq", updated, started)


def kafka_v1_value(
    pid: int,
    epoch: int,
    timeout: int,
    state: int,
    parts: dict[str, list[int]] | None,
    updated: int,
    started: int,
    tags: list[tuple[int, bytes]],
) -> bytes:
    """TransactionLogValue v1 (flexible) as Kafka 4.x writes it."""
    out = struct.pack(">hqhib", 1, pid, epoch, timeout, state)
    if parts is None:
        out += b"\x00"
    else:
        out += uvarint(len(parts) + 1)
        for topic, ps in parts.items():
            out += uvarint(len(topic) + 1) + topic.encode() + uvarint(len(ps) + 1)
            out += b"".join(struct.pack(">i", p) for p in ps) + b"\x00"
    out += struct.pack(">qq", updated, started) + uvarint(len(tags))
    for tag, payload in tags:
        out += uvarint(tag) + uvarint(len(payload)) + payload
    return out


def test_key_is_kafkas_v0_key():
    assert encode_key("tx-1") == b"\x00\x00\x00\x04tx-1"
    assert decode_key(b"\x00\x00\x00\x04tx-1") == "tx-1"
    assert decode_key(encode_key("ünï")) == "ünï"
    with pytest.raises(ProtocolError):
        decode_key(b"\x00\x01\x00\x01a")


def test_value_layout_matches_kafka_v1():
    meta = TransactionMetadata(
        "x",
        producer_id=7,
        producer_epoch=3,
        last_producer_epoch=2,
        previous_producer_id=5,
        timeout_ms=60000,
        state=TxnState.ONGOING,
        partitions={("t", 1), ("t", 0), ("u", 4)},
        start_ms=1000,
        last_update_ms=2000,
    )
    expected = kafka_v1_value(
        7,
        3,
        60000,
        1,
        {"t": [0, 1], "u": [4]},
        2000,
        1000,
        [(0, struct.pack(">q", 5)), (100, struct.pack(">h", 2))],
    )
    assert encode_value(meta) == expected


def test_empty_state_writes_a_null_partition_array():
    meta = TransactionMetadata("x", producer_id=1, producer_epoch=0, state=TxnState.EMPTY, last_update_ms=5)
    data = encode_value(meta)
    assert data[:17] == struct.pack(">hqhib", 1, 1, 0, 60000, 0)
    assert data[17] == 0  # null compact array


def test_reads_kafkas_v0_value():
    data = kafka_v0_value(42, 9, 30000, 4, {"orders": [2, 0]}, 111, 99)
    meta = decode_value("k", data)
    assert (meta.transactional_id, meta.producer_id, meta.producer_epoch, meta.timeout_ms, meta.state) == (
        "k",
        42,
        9,
        30000,
        TxnState.COMPLETE_COMMIT,
    )
    assert meta.partitions == {("orders", 0), ("orders", 2)}
    assert (meta.last_update_ms, meta.start_ms) == (111, 99)
    assert (meta.last_producer_epoch, meta.previous_producer_id) == (-1, -1)
    assert decode_value("k", kafka_v0_value(1, 0, 1000, 0, None, 1, -1)).partitions == set()


def test_reads_kafkas_v1_value_and_skips_unknown_tags():
    data = kafka_v1_value(
        42,
        9,
        30000,
        3,
        {"a": [1]},
        111,
        99,
        [
            (0, struct.pack(">q", 41)),
            (1, struct.pack(">q", 43)),
            (2, struct.pack(">h", 2)),
            (55, b"\x01\x02\x03"),
        ],
    )
    meta = decode_value("k", data)
    assert (meta.producer_id, meta.producer_epoch, meta.state, meta.previous_producer_id) == (
        42,
        9,
        TxnState.PREPARE_ABORT,
        41,
    )
    assert meta.partitions == {("a", 1)}
    assert meta.last_producer_epoch == -1  # Kafka never writes it


def test_unknown_value_version_is_refused():
    with pytest.raises(ProtocolError):
        decode_value("k", struct.pack(">h", 2) + b"\x00" * 40)


states = st.sampled_from(
    [
        TxnState.EMPTY,
        TxnState.ONGOING,
        TxnState.PREPARE_COMMIT,
        TxnState.PREPARE_ABORT,
        TxnState.COMPLETE_COMMIT,
        TxnState.COMPLETE_ABORT,
    ]
)
topics = st.text(alphabet="abcxyz._-", min_size=1, max_size=20)


@given(
    pid=st.integers(0, (1 << 63) - 1),
    epoch=st.integers(-1, 32767),
    last=st.integers(-1, 32767),
    previous=st.integers(-1, (1 << 63) - 1),
    timeout=st.integers(1, (1 << 31) - 1),
    state=states,
    partitions=st.sets(st.tuples(topics, st.integers(0, 10_000)), max_size=20),
    start=st.integers(-1, 1 << 45),
    updated=st.integers(-1, 1 << 45),
)
def test_round_trip(pid, epoch, last, previous, timeout, state, partitions, start, updated):
    meta = TransactionMetadata(
        "id",
        producer_id=pid,
        producer_epoch=epoch,
        last_producer_epoch=last,
        previous_producer_id=previous,
        timeout_ms=timeout,
        state=state,
        partitions=partitions,
        start_ms=start,
        last_update_ms=updated,
    )
    back = decode_value("id", encode_value(meta))
    for field in (
        "producer_id",
        "producer_epoch",
        "last_producer_epoch",
        "previous_producer_id",
        "timeout_ms",
        "state",
        "partitions",
        "start_ms",
        "last_update_ms",
    ):
        assert getattr(back, field) == getattr(meta, field), field
