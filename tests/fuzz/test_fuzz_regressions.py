"""Inputs the fuzzers found that broke a decoder's contract, kept as plain tests (each failed before its fix)."""

from __future__ import annotations

import pytest

from oncelog.coordinator.txn import log_format
from oncelog.protocol.primitives import ProtocolError
from oncelog.records.batch import OFF_ATTRIBUTES, read_header, rewrite_crc
from oncelog.records.control import ControlRecordError, build_marker, parse_marker
from tests.fuzz import corpus
from tests.integration.helpers import Wire, api_versions_ok


def test_marker_with_an_unknown_codec_is_not_a_marker():
    """parse_marker let UnsupportedCodecError out (attributes codec bits 7, CRC valid): a broker replaying
    such a batch at startup would have stopped."""
    batch = build_marker(6, 1, True, 0, 1_700_000_000_000)
    batch[OFF_ATTRIBUTES + 1] |= 0x07
    rewrite_crc(batch, 0, read_header(batch).size)
    with pytest.raises(ControlRecordError):
        parse_marker(batch)


def test_transaction_log_value_with_an_unknown_state():
    """decode_value let ValueError ("96 is not a valid TxnState") out instead of ProtocolError."""
    value = bytearray(corpus.txn_log_records()[1][0])
    value[16] = 96  # int16 version, int64 producer id, int16 epoch, int32 timeout, then int8 state
    with pytest.raises(ProtocolError, match="unknown transaction state 96"):
        log_format.decode_value("tx", bytes(value))


def test_a_null_string_in_a_string_array_is_malformed():
    """FindCoordinator v6 with a null among its coordinator_keys (compact string length 0) was decoded as [None]
    and the handler failed encoding its answer (AttributeError) instead of the request being refused as
    malformed, as Kafka refuses it."""
    from oncelog.protocol.messages import decode_request

    body = bytes([0, 2, 0, 0])  # key_type 0, a one-element compact array, its string null, no tagged fields
    with pytest.raises(ProtocolError, match="null element in coordinator_keys"):
        decode_request(10, 6, memoryview(body))
    assert decode_request(10, 6, memoryview(bytes([0, 2, 2]) + b"g" + bytes([0]))).coordinator_keys == ["g"]


POLICY_VIOLATION = 44


def test_absurd_partition_counts_are_refused_not_attempted(broker_factory):
    """One CreateTopics or CreatePartitions with a count of 2^31-1 (an int32 the fuzzer wrote over the count)
    made the broker create partition directories on the event loop until the disk or the process gave out.
    Refused as Kafka refuses more than 10000 partitions per request: POLICY_VIOLATION."""
    from kafka.protocol.admin import CreatePartitionsRequest, CreateTopicsRequest

    broker = broker_factory()
    create = CreateTopicsRequest[5]
    with Wire(broker.bootstrap, timeout=15) as w:
        resp = w.request(create(topics=[create.CreatableTopic(
            name="huge", num_partitions=0x7FFFFFFF, replication_factor=1, assignments=[], configs=[])],
            timeout_ms=10000, validate_only=False), 5)
        (topic,) = resp.topics
        assert topic.error_code == POLICY_VIOLATION, topic
        resp = w.request(create(topics=[create.CreatableTopic(
            name=f"t{i}", num_partitions=2500, replication_factor=1, assignments=[], configs=[])
            for i in range(5)], timeout_ms=10000, validate_only=False), 5)
        assert {t.error_code for t in resp.topics} == {POLICY_VIOLATION}, "the cap is per request"
        resp = w.request(create(topics=[create.CreatableTopic(
            name="small", num_partitions=2, replication_factor=1, assignments=[], configs=[])],
            timeout_ms=10000, validate_only=False), 5)
        assert resp.topics[0].error_code == 0
        grow = CreatePartitionsRequest[3]
        resp = w.request(grow(topics=[grow.CreatePartitionsTopic(name="small", count=0x7FFFFFFF, assignments=None)],
                              timeout_ms=10000, validate_only=False), 3)
        assert resp.results[0].error_code == POLICY_VIOLATION, resp
    assert api_versions_ok(broker.bootstrap)
