"""Fetched record bytes -> Messages: codecs, offsets, partial batches, CRC, read_committed filtering."""

from __future__ import annotations

import pytest

from oncelog.client.consumer.decode import CorruptRecords, decode_fetch
from oncelog.client.types import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, Message
from oncelog.records.builder import BatchBuilder
from oncelog.records.control import build_marker

TS = 1_700_000_000_000


def batch(base: int, values: list[bytes], *, codec: int = 0, pid: int = -1, txn: bool = False,
          log_append_time: bool = False, leader_epoch: int = -1, headers=()) -> bytearray:
    b = BatchBuilder(codec, transactional=txn, log_append_time=log_append_time)
    for i, v in enumerate(values):
        b.append(b"k" + v, v, headers, TS + i)
    return b.build(base_offset=base, producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
                   base_sequence=0 if pid >= 0 else -1, partition_leader_epoch=leader_epoch,
                   max_timestamp=TS + 500 if log_append_time else None)


def marker(offset: int, pid: int, commit: bool) -> bytearray:
    return build_marker(pid, 0, commit, 1, TS, base_offset=offset)


def offsets(msgs: list[Message]) -> list[int]:
    return [m.offset() for m in msgs]


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_every_codec_decodes_to_the_same_messages(codec):
    data = batch(0, [b"a", b"b"], codec=codec, headers=[("h", b"1"), ("n", None)]) + batch(2, [b"c"], codec=codec)
    out = decode_fetch("t", 3, bytes(data), 0, read_committed=False)
    assert [(m.topic(), m.partition(), m.offset(), m.key(), m.value()) for m in out.messages()] == [
        ("t", 3, 0, b"ka", b"a"), ("t", 3, 1, b"kb", b"b"), ("t", 3, 2, b"kc", b"c")]
    assert out.messages()[0].headers() == [("h", b"1"), ("n", None)]
    assert out.messages()[2].timestamp() == (TIMESTAMP_CREATE_TIME, TS)
    assert out.messages()[0].error() is None and len(out.messages()[0]) == 1
    assert out.next_offset == 3 and out.size == len(data)


def test_messages_before_the_fetch_offset_are_dropped_and_partial_tail_left():
    first = batch(10, [b"a", b"b", b"c"], codec=1)
    second = batch(13, [b"d", b"e"])
    data = bytes(first + second)
    out = decode_fetch("t", 0, data + bytes(second[:40]), 11, read_committed=False)
    assert offsets(out.messages()) == [11, 12, 13, 14]
    assert out.next_offset == 15 and out.size == len(data)
    cut = decode_fetch("t", 0, data[: len(first) + 30], 11, read_committed=False)
    assert offsets(cut.messages()) == [11, 12] and cut.next_offset == 13


def test_only_a_partial_batch_gives_nothing_and_keeps_the_offset():
    data = bytes(batch(5, [b"x" * 100]))
    out = decode_fetch("t", 0, data[:-1], 5, read_committed=False)
    assert out.records == [] and out.next_offset == 5 and out.size == 0


def test_log_append_time_and_leader_epoch_come_from_the_batch():
    out = decode_fetch("t", 0, bytes(batch(0, [b"a", b"b"], log_append_time=True, leader_epoch=4)), 0,
                       read_committed=False)
    assert [m.timestamp() for m in out.messages()] == [(TIMESTAMP_LOG_APPEND_TIME, TS + 500)] * 2
    assert out.messages()[0].leader_epoch() == 4
    plain = decode_fetch("t", 0, bytes(batch(0, [b"a"])), 0, read_committed=False)
    assert plain.messages()[0].leader_epoch() is None and plain.messages()[0].headers() is None


def test_a_flipped_byte_fails_the_crc_unless_checks_are_off():
    good = batch(0, [b"a"])
    bad = bytearray(batch(1, [b"b"]))
    bad[-2] ^= 0x01  # the value byte: "b" -> "c"
    with pytest.raises(CorruptRecords) as info:
        decode_fetch("t", 0, bytes(good + bad), 0, read_committed=False)
    assert info.value.offset == 1
    out = decode_fetch("t", 0, bytes(good + bad), 0, read_committed=False, check_crcs=False)
    assert [m.value() for m in out.messages()] == [b"a", b"c"]


def test_wrong_magic_is_corrupt():
    data = bytearray(batch(0, [b"a"]))
    data[16] = 1
    with pytest.raises(CorruptRecords, match="magic 1"):
        decode_fetch("t", 0, bytes(data), 0, read_committed=False)


def _txn_log() -> tuple[bytes, list[tuple[int, int]]]:
    """pid 7 aborts offsets 0-1 (marker 4), pid 8 commits 2-3 (marker 5), plain 6, pid 7 again commits 7 (marker 8)."""
    parts = [
        batch(0, [b"a0", b"a1"], pid=7, txn=True),
        batch(2, [b"c2", b"c3"], pid=8, txn=True),
        marker(4, 7, commit=False),
        marker(5, 8, commit=True),
        batch(6, [b"p6"]),
        batch(7, [b"c7"], pid=7, txn=True),
        marker(8, 7, commit=True),
    ]
    return bytes(b"".join(parts)), [(7, 0)]


def test_read_committed_drops_aborted_transactions_and_control_batches():
    data, aborted = _txn_log()
    out = decode_fetch("t", 0, data, 0, read_committed=True, aborted=aborted)
    assert [m.value() for m in out.messages()] == [b"c2", b"c3", b"p6", b"c7"]
    assert offsets(out.messages()) == [2, 3, 6, 7]
    assert out.next_offset == 9  # past the last marker


def test_read_uncommitted_keeps_aborted_records_but_never_control_batches():
    data, aborted = _txn_log()
    out = decode_fetch("t", 0, data, 0, read_committed=False, aborted=aborted)
    assert offsets(out.messages()) == [0, 1, 2, 3, 6, 7]


def test_aborted_list_is_ignored_for_a_producer_after_its_abort_marker():
    # A second aborted transaction of pid 7 starting at 7 drops only that one.
    data, _ = _txn_log()
    out = decode_fetch("t", 0, data, 0, read_committed=True, aborted=[(7, 0), (7, 7)])
    assert offsets(out.messages()) == [2, 3, 6]


def test_fetch_that_is_only_control_and_aborted_advances_the_offset():
    data = bytes(batch(0, [b"a"], pid=3, txn=True) + marker(1, 3, commit=False))
    out = decode_fetch("t", 0, data, 0, read_committed=True, aborted=[(3, 0)])
    assert out.records == [] and out.next_offset == 2


def test_empty_records():
    assert decode_fetch("t", 0, b"", 42, read_committed=True) == ([], [], 42, 0)
    assert decode_fetch("t", 0, None, 42, read_committed=True) == ([], [], 42, 0)


def test_batches_without_headers_give_plain_tuples_the_collector_ignores():
    import gc

    data = batch(0, [b"a", b"b"]) + batch(2, [b"c"], headers=[("h", b"1")])
    out = decode_fetch("t", 0, bytes(data), 0, read_committed=False)
    assert [type(r) for r in out.records] == [tuple, tuple, tuple]
    assert [len(r) for r in out.records] == [4, 4, 5]
    gc.collect()
    assert not gc.is_tracked(out.records[0])  # atomic contents: untracked
    assert [start for start, _ in out.kinds] == [0, 2]  # two kinds of Message: without and with headers
    msgs = out.messages()
    assert [m.headers() for m in msgs] == [None, None, [("h", b"1")]]
    assert [m.value() for m in msgs] == [b"a", b"b", b"c"]
