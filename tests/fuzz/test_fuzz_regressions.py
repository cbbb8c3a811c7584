"""Inputs the fuzzers found that broke a decoder's contract, kept as plain tests (each failed before its fix)."""

from __future__ import annotations

import pytest

from oncelog.coordinator.txn import log_format
from oncelog.protocol.primitives import ProtocolError
from oncelog.records.batch import OFF_ATTRIBUTES, read_header, rewrite_crc
from oncelog.records.control import ControlRecordError, build_marker, parse_marker
from tests.fuzz import corpus


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
