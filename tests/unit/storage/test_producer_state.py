"""ProducerStateManager: the seeds' broker-side rules (DESIGN §3), expiry, and snapshots on real files.

Every rule is checked with its exact error code; `check` must never change state, `record` is what an
append does. The last part drives a real Partition (PartitionLog in tmp_path): crash recovery replays the
log after the newest snapshot, and moving the log start offset past a producer's data keeps its state.
"""

from __future__ import annotations

import copy
import os
from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oncelog.errors import ErrorCode
from oncelog.records.batch import TRANSACTIONAL_MASK, BatchHeader, read_header
from oncelog.records.builder import build_batch
from oncelog.storage.partition import Partition
from oncelog.storage.producer_state import (
    DUPLICATE_WINDOW,
    SNAPSHOT_VERSION,
    SNAPSHOTS_KEPT,
    CachedBatch,
    ProducerEntry,
    ProducerStateManager,
    decode_snapshot,
    encode_snapshot,
)

NONE = 0
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
DUPLICATE_SEQUENCE_NUMBER = 46
INVALID_PRODUCER_EPOCH = 47
UNKNOWN_PRODUCER_ID = 59
MAX_SEQ = 2**31 - 1

PID = 4242
OTHER = 777


def hdr(pid: int, epoch: int, seq: int, count: int = 1, ts: int = 1000, transactional: bool = False) -> BatchHeader:
    return BatchHeader(
        base_offset=0, length=49 + 10 * count, leader_epoch=-1, magic=2, crc=0,
        attributes=TRANSACTIONAL_MASK if transactional else 0, last_offset_delta=count - 1,
        base_timestamp=ts, max_timestamp=ts + count - 1, producer_id=pid, producer_epoch=epoch,
        base_sequence=seq, record_count=count,
    )


def state_of(mgr: ProducerStateManager) -> dict:
    return {pid: copy.deepcopy(e) for pid, e in mgr.entries.items()}


class Log:
    """The append path without a log: check, then record at the next offset (as Partition.append_records)."""

    def __init__(self, mgr: ProducerStateManager, now: int = 1_000_000) -> None:
        self.mgr = mgr
        self.leo = 0
        self.now = now

    def send(self, pid: int, epoch: int, seq: int, count: int = 1, ts: int = 1000, transactional: bool = False):
        """Returns (error code, base offset); a duplicate answers with its cached base offset."""
        header = hdr(pid, epoch, seq, count, ts, transactional)
        before = state_of(self.mgr)
        verdict = self.mgr.check(header)
        assert state_of(self.mgr) == before, "check() changed the producer state"
        if verdict.duplicate is not None:
            assert verdict.error == NONE
            return NONE, verdict.duplicate.first_offset
        if verdict.error:
            assert verdict.message, "every refusal carries a message"
            return int(verdict.error), -1
        base = self.leo
        self.mgr.record(header, base, self.now)
        self.leo += count
        return NONE, base

    def filler(self, count: int = 3) -> None:
        """A non-idempotent batch, so offsets and sequences differ."""
        leo = self.leo
        assert self.send(-1, -1, -1, count) == (NONE, leo)


@pytest.fixture
def mgr(tmp_path):
    return ProducerStateManager(tmp_path, "t-0")


@pytest.fixture
def log(mgr):
    return Log(mgr)


def five_batches(log: Log, pid: int = PID, epoch: int = 0, start_seq: int = 0) -> list[tuple[int, int, int]]:
    """Six batches (sizes 1..6) interleaved with fillers; returns (first seq, count, base offset) of each."""
    sent = []
    seq = start_seq
    for count in range(1, 7):
        log.filler()
        code, base = log.send(pid, epoch, seq, count)
        assert code == NONE and base == log.leo - count
        sent.append((seq, count, base))
        seq = (seq + count) % 2**31
    return sent


# -- rule 5: unknown producers --------------------------------------------------------------------------------


def test_batches_without_producer_id_pass(log):
    for _ in range(3):
        assert log.send(-1, -1, -1, 2)[0] == NONE
    assert log.mgr.entries == {}


@pytest.mark.parametrize("seq", [1, 5, 1000, MAX_SEQ])
def test_unknown_producer_needs_sequence_zero(log, seq):
    assert log.send(PID, 0, seq) == (UNKNOWN_PRODUCER_ID, -1)
    assert log.mgr.stats["unknown_producer"] == 1
    assert PID not in log.mgr.entries
    assert log.send(PID, 3, 0, 4) == (NONE, 0)  # any epoch, sequence 0
    entry = log.mgr.entries[PID]
    assert (entry.epoch, entry.last_seq, entry.last_offset) == (3, 3, 3)


def test_unknown_producer_message_names_the_sequence(mgr):
    verdict = mgr.check(hdr(PID, 0, 5))
    assert verdict.error == ErrorCode.UNKNOWN_PRODUCER_ID
    assert "5" in verdict.message and str(PID) in verdict.message


# -- rule 4: sequences in order -------------------------------------------------------------------------------


def test_next_sequence_is_accepted(log):
    seq = 0
    for count in (1, 2, 3, 4):
        log.filler(2)
        leo = log.leo
        assert log.send(PID, 0, seq, count) == (NONE, leo)
        seq += count
    entry = log.mgr.entries[PID]
    assert entry.last_seq == 9
    assert [(b.first_seq, b.last_seq) for b in entry.batches] == [(0, 0), (1, 2), (3, 5), (6, 9)]


@pytest.mark.parametrize("seq", [22, 23, 510, 1_000_000, MAX_SEQ - 2000])
def test_gap_is_out_of_order(log, seq):
    five_batches(log)  # last seq 20
    leo = log.leo
    assert log.send(PID, 0, seq) == (OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
    assert log.leo == leo
    assert log.mgr.stats["out_of_order"] == 1
    assert log.send(PID, 0, 21) == (NONE, leo)


def test_batch_straddling_the_last_sequence_is_out_of_order(log):
    five_batches(log)  # last seq 20
    # starts inside what was written, ends beyond it: neither a duplicate nor the next batch
    assert log.send(PID, 0, 19, 4) == (OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
    assert log.send(PID, 0, 20, 2) == (OUT_OF_ORDER_SEQUENCE_NUMBER, -1)


def test_first_batch_after_entry_without_batches_needs_zero(mgr):
    """An entry with an epoch but no cached batch (e.g. only a marker) expects sequence 0."""
    mgr.record_marker(PID, 2, 0, now_ms=1, timestamp=1)
    assert mgr.check(hdr(PID, 2, 3)).error == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert mgr.check(hdr(PID, 2, 0)).ok


# -- rule 1: exact duplicates of the last 5 batches -----------------------------------------------------------


@pytest.mark.parametrize("back", [1, 2, 3, 4, 5])
def test_duplicate_of_each_of_the_last_five(log, back):
    sent = five_batches(log)
    leo = log.leo
    seq, count, base = sent[-back]
    assert log.send(PID, 0, seq, count) == (NONE, base)
    verdict = log.mgr.check(hdr(PID, 0, seq, count))
    assert verdict.duplicate == CachedBatch(seq, seq + count - 1, base, base + count - 1, 1000 + count - 1)
    assert log.leo == leo
    assert log.mgr.stats["duplicates_cached"] == 2
    # the producer goes on where it was
    assert log.send(PID, 0, 21) == (NONE, leo)


def test_duplicates_of_all_five_in_any_order(log):
    sent = five_batches(log)
    leo = log.leo
    for seq, count, base in reversed(sent[1:]):
        assert log.send(PID, 0, seq, count) == (NONE, base)
    for seq, count, base in sent[1:]:
        assert log.send(PID, 0, seq, count) == (NONE, base)
    assert log.leo == leo


# -- rule 3: older duplicates inside the window ----------------------------------------------------------------


def test_sixth_oldest_batch_is_a_window_duplicate(log):
    sent = five_batches(log)
    leo = log.leo
    seq, count, _ = sent[0]  # the 6th-oldest batch, evicted from the cache
    assert log.send(PID, 0, seq, count) == (DUPLICATE_SEQUENCE_NUMBER, -1)
    assert log.mgr.stats["duplicates_window"] == 1
    assert log.leo == leo
    assert len(log.mgr.entries[PID].batches) == 5


def test_window_duplicates_with_other_boundaries(log):
    five_batches(log)  # batches 0 | 1-2 | 3-5 | 6-9 | 10-14 | 15-20
    # a sub-range or a range across cached batch boundaries is written data, but not an exact batch
    for first, count in [(0, 1), (1, 1), (2, 3), (4, 4), (15, 3), (20, 1)]:
        assert log.send(PID, 0, first, count) == (DUPLICATE_SEQUENCE_NUMBER, -1), (first, count)


def test_window_boundary(log):
    # one batch of 999 records (seq 0..998), then single records 999..1005
    assert log.send(PID, 0, 0, 999) == (NONE, 0)
    for seq in range(999, 1006):
        assert log.send(PID, 0, seq)[0] == NONE
    last = 1005
    assert last - 6 == DUPLICATE_WINDOW - 1
    assert log.send(PID, 0, 6) == (DUPLICATE_SEQUENCE_NUMBER, -1)  # 999 behind
    assert log.send(PID, 0, 5) == (OUT_OF_ORDER_SEQUENCE_NUMBER, -1)  # 1000 behind: too old to tell
    assert log.send(PID, 0, 6, 10) == (DUPLICATE_SEQUENCE_NUMBER, -1)
    assert log.send(PID, 0, 5, 10) == (OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
    assert log.send(PID, 0, 0, 999) == (OUT_OF_ORDER_SEQUENCE_NUMBER, -1)


def test_max_batches_is_configurable(tmp_path):
    log = Log(ProducerStateManager(tmp_path, "t-0", max_batches=2))
    sent = five_batches(log)
    for seq, count, base in sent[-2:]:
        assert log.send(PID, 0, seq, count) == (NONE, base)
    seq, count, _ = sent[-3]
    assert log.send(PID, 0, seq, count) == (DUPLICATE_SEQUENCE_NUMBER, -1)


# -- the wrap at 2^31-1 ----------------------------------------------------------------------------------------


def test_wrap_to_zero_is_accepted(log):
    # state as if the producer had written 2^31 records: the cache holds the last five before the wrap
    start = MAX_SEQ - 14  # batches of 1..5 records end exactly at MAX_SEQ
    sent = []
    seq = start
    log.mgr.record(hdr(PID, 0, 0), 0, log.now)  # the producer exists
    log.leo = 1
    for count in range(1, 6):
        log.filler(2)
        header = hdr(PID, 0, seq, count)
        log.mgr.record(header, log.leo, log.now)
        sent.append((seq, count, log.leo))
        log.leo += count
        seq += count
    assert log.mgr.entries[PID].last_seq == MAX_SEQ
    assert log.send(PID, 0, 1) == (OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
    leo = log.leo
    assert log.send(PID, 0, 0, 3) == (NONE, leo)  # 0..2
    # duplicates across the wrap: cached ones with their offsets, evicted ones as window duplicates
    for seq, count, base in sent[1:]:
        assert log.send(PID, 0, seq, count) == (NONE, base)
    assert log.send(PID, 0, sent[0][0], sent[0][1]) == (DUPLICATE_SEQUENCE_NUMBER, -1)
    assert log.send(PID, 0, 0, 3) == (NONE, leo)
    assert log.send(PID, 0, MAX_SEQ - 500, 10) == (DUPLICATE_SEQUENCE_NUMBER, -1)
    assert log.send(PID, 0, MAX_SEQ - 1200, 10) == (OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
    assert log.leo == leo + 3
    assert log.send(PID, 0, 3) == (NONE, leo + 3)


def test_batch_across_the_wrap(log):
    log.mgr.record(hdr(PID, 0, 0), 0, log.now)
    log.mgr.record(hdr(PID, 0, MAX_SEQ - 10, 9), 1, log.now)  # ..MAX_SEQ-2
    log.leo = 10
    header = hdr(PID, 0, MAX_SEQ - 1, 4)
    assert header.last_sequence == 1
    assert log.send(PID, 0, MAX_SEQ - 1, 4) == (NONE, 10)  # MAX_SEQ-1, MAX_SEQ, 0, 1
    assert log.mgr.entries[PID].last_seq == 1
    assert log.send(PID, 0, MAX_SEQ - 1, 4) == (NONE, 10)  # its duplicate
    assert log.send(PID, 0, MAX_SEQ, 2) == (DUPLICATE_SEQUENCE_NUMBER, -1)  # part of it, across the wrap
    assert log.send(PID, 0, 0, 2) == (DUPLICATE_SEQUENCE_NUMBER, -1)
    assert log.send(PID, 0, 3) == (OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
    assert log.send(PID, 0, 2, 5) == (NONE, 14)


# -- rules 2 and 4: epochs -------------------------------------------------------------------------------------


def test_higher_epoch_starts_at_zero(log):
    sent = five_batches(log)
    assert log.send(PID, 1, 21) == (OUT_OF_ORDER_SEQUENCE_NUMBER, -1)  # the old sequence does not carry over
    assert log.send(PID, 1, 3) == (OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
    leo = log.leo
    assert log.send(PID, 1, 0, 2) == (NONE, leo)
    entry = log.mgr.entries[PID]
    assert (entry.epoch, entry.last_seq, len(entry.batches)) == (1, 1, 1)
    assert log.send(PID, 1, 0, 2) == (NONE, leo)  # duplicate in the new epoch
    assert log.send(PID, 1, 2) == (NONE, leo + 2)
    # the old epoch's batches are fenced now, cached or not
    for seq, count, _ in sent:
        assert log.send(PID, 0, seq, count) == (INVALID_PRODUCER_EPOCH, -1)
    assert log.send(PID, 0, 21) == (INVALID_PRODUCER_EPOCH, -1)
    assert log.mgr.stats["fenced_epoch"] == len(sent) + 1
    # a jump of several epochs is fine too (librdkafka bumps locally)
    assert log.send(PID, 7, 0) == (NONE, leo + 3)
    assert log.send(PID, 5, 0) == (INVALID_PRODUCER_EPOCH, -1)


def test_older_epoch_is_fenced_before_the_window(log):
    log.send(PID, 3, 0, 5)
    assert log.send(PID, 2, 0, 5) == (INVALID_PRODUCER_EPOCH, -1)
    assert log.send(PID, 2, 5) == (INVALID_PRODUCER_EPOCH, -1)
    assert log.send(PID, 2, 1) == (INVALID_PRODUCER_EPOCH, -1)


def test_producers_are_independent(log):
    a = five_batches(log, PID)
    b = five_batches(log, OTHER, epoch=2)
    for (seq, count, base_a), (_, _, base_b) in zip(a[1:], b[1:], strict=True):
        assert log.send(PID, 0, seq, count) == (NONE, base_a)
        assert log.send(OTHER, 2, seq, count) == (NONE, base_b)
    assert log.send(OTHER, 0, 21) == (INVALID_PRODUCER_EPOCH, -1)
    assert log.send(PID, 0, 21)[0] == NONE


# -- KIP-360: state outlives data; expiry only by idleness ----------------------------------------------------


def test_expiry_by_idleness(log):
    mgr = log.mgr
    log.now = 10_000
    five_batches(log, PID)
    log.now = 15_000
    five_batches(log, OTHER)
    log.send(99, 0, 0, transactional=True)  # open transaction: never expires
    assert mgr.expire(now_ms=10_000 + 4_999, expiration_ms=5_000) == []
    assert sorted(mgr.expire(now_ms=15_000, expiration_ms=5_000)) == [PID]  # idle exactly 5000 ms
    assert set(mgr.entries) == {OTHER, 99}
    assert mgr.expire(now_ms=10**9, expiration_ms=5_000) == [OTHER]
    assert set(mgr.entries) == {99} and mgr.open_transaction(99)
    # an expired producer is unknown: its next sequence is refused with UNKNOWN_PRODUCER_ID, 0 starts over
    assert log.send(PID, 0, 21) == (UNKNOWN_PRODUCER_ID, -1)
    assert log.send(PID, 0, 15, 6) == (UNKNOWN_PRODUCER_ID, -1)  # its former duplicate, too
    assert log.send(PID, 0, 0)[0] == NONE
    assert log.send(PID, 1, 0)[0] == NONE


def test_activity_postpones_expiry(log):
    log.now = 1_000
    log.send(PID, 0, 0)
    log.now = 5_000
    log.send(PID, 0, 1)
    assert log.mgr.expire(now_ms=7_000, expiration_ms=3_000) == []
    assert log.mgr.expire(now_ms=8_000, expiration_ms=3_000) == [PID]


# -- snapshots ----------------------------------------------------------------------------------------------------


def test_snapshot_round_trip_keeps_every_cached_batch(tmp_path, log):
    a = five_batches(log, PID, epoch=3)
    b = five_batches(log, OTHER, epoch=0, start_seq=0)
    log.send(99, 1, 0, 2, transactional=True)
    log.mgr.entries[OTHER].coordinator_epoch = 7
    log.mgr.write_snapshot(log.leo)
    assert log.mgr.list_snapshots() == [log.leo]

    fresh = ProducerStateManager(tmp_path, "t-0")
    assert fresh.load_latest_snapshot(log.leo) == log.leo
    assert fresh.entries == log.mgr.entries
    assert fresh.ongoing == {99: log.leo - 2}
    assert fresh.first_unstable_offset() == log.leo - 2
    again = Log(fresh)
    again.leo = log.leo
    for (seq, count, base) in a[1:]:
        assert again.send(PID, 3, seq, count) == (NONE, base)
    for (seq, count, base) in b[1:]:
        assert again.send(OTHER, 0, seq, count) == (NONE, base)
    assert again.send(PID, 3, a[0][0], a[0][1]) == (DUPLICATE_SEQUENCE_NUMBER, -1)
    assert again.send(PID, 2, 0) == (INVALID_PRODUCER_EPOCH, -1)
    assert again.send(PID, 3, 21) == (NONE, log.leo)


def test_snapshot_codec_round_trip():
    entries = [
        ProducerEntry(1, 0, -1, 5, 6, -1),
        ProducerEntry(2**62, 32767, 12, -1, 10**12, 77,
                      batches=deque([CachedBatch(MAX_SEQ - 1, 1, 10, 13, 99)])),
    ]
    data = encode_snapshot(entries)
    assert int.from_bytes(data[:2], "big") == SNAPSHOT_VERSION
    assert decode_snapshot(data) == entries
    assert decode_snapshot(encode_snapshot([])) == []


def _flip(path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position % len(data)] ^= 0x40
    path.write_bytes(bytes(data))


CORRUPTIONS = {
    "body-byte": lambda p: _flip(p, -3),
    "crc": lambda p: _flip(p, 3),
    "version": lambda p: _flip(p, 1),
    "truncated": lambda p: p.write_bytes(p.read_bytes()[:-5]),
    "trailing": lambda p: p.write_bytes(p.read_bytes() + b"\x00"),
    "empty": lambda p: p.write_bytes(b""),
}


@pytest.mark.parametrize("damage", sorted(CORRUPTIONS))
def test_corrupt_snapshot_falls_back_to_an_older_one(tmp_path, log, damage):
    five_batches(log)
    old_offset = log.leo
    log.mgr.write_snapshot(old_offset)
    old_state = state_of(log.mgr)
    assert log.send(PID, 0, 21, 4)[0] == NONE
    log.mgr.write_snapshot(log.leo)
    path = log.mgr.snapshot_path(log.leo)
    CORRUPTIONS[damage](path)
    with pytest.raises(ValueError):
        decode_snapshot(path.read_bytes())

    fresh = ProducerStateManager(tmp_path, "t-0")
    assert fresh.load_latest_snapshot(log.leo) == old_offset
    assert fresh.entries == old_state
    assert not path.exists(), "the unusable snapshot is removed"
    assert fresh.list_snapshots() == [old_offset]


def test_every_snapshot_corrupt_means_no_state(tmp_path, log):
    five_batches(log)
    for offset in (5, 10):
        log.mgr.write_snapshot(offset)
        _flip(log.mgr.snapshot_path(offset), -1)
    fresh = ProducerStateManager(tmp_path, "t-0")
    fresh.entries = {1: ProducerEntry(1)}
    fresh.ongoing = {1: 0}
    assert fresh.load_latest_snapshot(100) is None
    assert fresh.entries == {} and fresh.ongoing == {}


def test_snapshot_above_the_log_end_is_dropped(tmp_path, log):
    five_batches(log)
    log.mgr.write_snapshot(10)
    at_ten = state_of(log.mgr)
    log.send(PID, 0, 21)
    log.mgr.write_snapshot(30)
    fresh = ProducerStateManager(tmp_path, "t-0")
    assert fresh.load_latest_snapshot(29) == 10  # the log ends at 29: the snapshot at 30 describes lost data
    assert fresh.entries == at_ten
    assert fresh.list_snapshots() == [10]
    assert fresh.load_latest_snapshot(10) == 10  # a snapshot exactly at the log end is fine


def test_only_the_newest_snapshots_are_kept(tmp_path, log):
    five_batches(log)
    for offset in range(1, 7):
        log.mgr.write_snapshot(offset)
    assert log.mgr.list_snapshots() == list(range(7 - SNAPSHOTS_KEPT, 7))
    assert not any(name.endswith(".tmp") for name in os.listdir(tmp_path))


def test_no_snapshot(tmp_path):
    mgr = ProducerStateManager(tmp_path, "t-0")
    (tmp_path / "junk.snapshot").write_bytes(b"x")  # not an offset: ignored
    assert mgr.list_snapshots() == []
    assert mgr.load_latest_snapshot(10) is None


# -- property: a resend of anything already written is never appended ------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(1, 300), min_size=1, max_size=25), start=st.sampled_from([0, MAX_SEQ - 700]),
       pick=st.integers(0, 10**6))
def test_resends_are_never_appended(tmp_path, sizes, start, pick):
    log = Log(ProducerStateManager(tmp_path, "prop"))
    if start:  # as if the producer had already written `start` records: its last sequence is start - 1
        log.mgr.record(hdr(PID, 0, start - 1), 0, log.now)
        log.leo = 1
    sent = []
    seq = start
    for size in sizes:
        code, base = log.send(PID, 0, seq, size)
        assert code == NONE
        sent.append((seq, size, base))
        seq = (seq + size) % 2**31
    leo = log.leo
    index = pick % len(sent)
    first, size, base = sent[index]
    behind = sum(s for _, s, _ in sent[index:]) - 1  # from the last sequence back to this batch's first
    code, answer = log.send(PID, 0, first, size)
    if index >= len(sent) - 5:
        assert (code, answer) == (NONE, base)
    elif behind < DUPLICATE_WINDOW:
        assert code == DUPLICATE_SEQUENCE_NUMBER
    else:
        assert code == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log.leo == leo


# -- a real partition: recovery replays the log after the newest snapshot ---------------------------------------


def put(part: Partition, pid: int, epoch: int, seq: int, count: int, tag: str = "v"):
    buf = build_batch([(None, f"{tag}-{i}".encode(), (), 1_000_000) for i in range(count)],
                      producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    return part.append_records(buf, read_header(buf), 1_000_000, False)


def put_plain(part: Partition) -> None:
    plain = build_batch([(None, b"plain", (), 1_000_000)])
    assert part.append_records(plain, read_header(plain), 1_000_000, False).error == NONE


def fill(part: Partition, batches: int, seq: int = 0) -> list[tuple[int, int, int]]:
    """`batches` idempotent batches of 1-3 records from sequence `seq`, each after a plain batch."""
    sent = []
    for i in range(batches):
        put_plain(part)
        count = 1 + i % 3
        result = put(part, PID, 0, seq, count, f"s{seq}")
        assert result.error == NONE and not result.duplicate
        sent.append((seq, count, result.base_offset))
        seq += count
    return sent


def check_duplicates(part: Partition, sent: list[tuple[int, int, int]]) -> None:
    leo = part.log.log_end_offset
    for seq, count, base in sent[-5:]:
        result = put(part, PID, 0, seq, count, "resend")
        assert (result.error, result.base_offset, result.duplicate) == (NONE, base, True)
    seq, count, _ = sent[-6]
    assert put(part, PID, 0, seq, count, "resend").error == DUPLICATE_SEQUENCE_NUMBER
    assert part.log.log_end_offset == leo
    seq, count, _ = sent[-1]
    result = put(part, PID, 0, seq + count + 1, 1, "gap")
    assert result.error == OUT_OF_ORDER_SEQUENCE_NUMBER


@pytest.mark.parametrize("snapshot_at", [None, "start", "middle", "end"])
def test_recovery_replays_the_log_after_the_snapshot(open_log, crash, snapshot_at):
    part = Partition(open_log(fsync=False))
    if snapshot_at == "start":
        part.snapshot()
    sent = fill(part, 4)
    if snapshot_at == "middle":
        part.snapshot()
    sent += fill(part, 4, seq=sent[-1][0] + sent[-1][1])
    if snapshot_at == "end":
        part.snapshot()
    before = state_of(part.producers)
    crash(part.log)

    again = Partition(open_log(clean=False, fsync=False))
    again.load_producer_state(2_000_000)
    got = state_of(again.producers)
    assert got.keys() == before.keys() == {PID}
    assert got[PID].batches == before[PID].batches
    assert (got[PID].epoch, got[PID].last_timestamp) == (before[PID].epoch, before[PID].last_timestamp)
    check_duplicates(again, sent)
    # recovery leaves a snapshot at the log end, so the next start needs no replay
    assert again.producers.list_snapshots()[-1] == again.log.log_end_offset


def test_clean_close_and_reopen(open_log):
    part = Partition(open_log(fsync=False))
    sent = fill(part, 7)
    part.close()
    again = Partition(open_log(fsync=False))
    again.load_producer_state(2_000_000)
    assert again.producers.list_snapshots()[-1] == again.log.log_end_offset
    check_duplicates(again, sent)


@pytest.mark.parametrize("segment_bytes", [300, 1 << 20], ids=["rolled", "one-segment"])
@pytest.mark.parametrize("restart", ["none", "crash", "clean"])
def test_state_outlives_deleted_records(open_log, crash, restart, segment_bytes):
    """KIP-360: DeleteRecords past all of a producer's data keeps its state (also across a restart)."""
    part = Partition(open_log(fsync=False, segment_bytes=segment_bytes))
    sent = fill(part, 7)
    put_plain(part)
    end = part.log.log_end_offset
    assert part.log.delete_records_before(end) == end
    assert PID in part.producers.entries
    if restart == "crash":
        crash(part.log)
    elif restart == "clean":
        part.close()
    if restart != "none":
        part = Partition(open_log(clean=restart == "clean", fsync=False, log_start_offset=end,
                                  segment_bytes=segment_bytes))
        part.load_producer_state(2_000_000)
    assert part.log.log_start_offset == end
    check_duplicates(part, sent)
    last_seq = sent[-1][0] + sent[-1][1]
    result = put(part, PID, 0, last_seq, 2, "next")
    assert (result.error, result.base_offset, result.duplicate) == (NONE, end, False)


def test_idle_producer_loses_its_cache_but_keeps_its_place(log):
    """producer.id.expiration.ms drops the cached batches; the epoch and last sequence stay until the producer is
    forgotten (transactional.id.expiration.ms), so a returning producer continues."""
    mgr = log.mgr
    log.now = 10_000
    five_batches(log, PID)
    last = mgr.entries[PID].last_seq
    assert mgr.expire(now_ms=16_000, expiration_ms=5_000, forget_ms=60_000) == []
    entry = mgr.entries[PID]
    assert not entry.batches and entry.floor_seq == last == entry.last_seq
    assert log.send(PID, 0, last, 1) == (DUPLICATE_SEQUENCE_NUMBER, -1)  # a retry: no longer cached, in window
    assert log.send(PID, 0, last + 2)[0] == OUT_OF_ORDER_SEQUENCE_NUMBER  # a gap is still a gap
    assert log.send(PID, 0, last + 1)[0] == NONE  # it continues where it stopped
    assert mgr.expire(now_ms=10**9, expiration_ms=5_000, forget_ms=60_000) == [PID]
    assert log.send(PID, 0, last + 2) == (UNKNOWN_PRODUCER_ID, -1)
