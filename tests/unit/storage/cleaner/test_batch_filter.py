"""The per-batch rules of a clean (storage/cleaner/batch_filter.py, docs/log-cleaner.md §1) on built batches.

Every batch written back is checked the way a consumer would read it: CRC, header fields, and the records decoded
by the same parser the client uses."""

from __future__ import annotations

import pytest

from oncelog.records.batch import (
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    DELETE_HORIZON_MASK,
    crc_ok,
    read_header,
)
from oncelog.records.builder import build_batch
from oncelog.records.control import build_marker, parse_marker
from oncelog.records.raw_records import RawRecordError, encode, walk
from oncelog.records.reader import decode_batch_records
from oncelog.storage.cleaner.batch_filter import (
    CleanRules,
    TransactionTracker,
    add_to_map,
    filter_batch,
    records_section,
)
from oncelog.storage.cleaner.offset_map import OffsetMap
from oncelog.storage.txn_index import AbortedTxn

NOW = 1_700_000_000_000
RETENTION = 86_400_000
T0 = NOW - 3_600_000


def batch(records, base, **kw) -> memoryview:
    """records: [(key, value)] with timestamps T0, T0+1, ..."""
    rows = [(k, v, (), T0 + i) for i, (k, v) in enumerate(records)]
    return memoryview(build_batch(rows, base_offset=base, **kw))


def mapped(*batches: memoryview, buffer_bytes: int = 1 << 20) -> OffsetMap:
    m = OffsetMap(buffer_bytes)
    for b in batches:
        assert add_to_map(m, b, read_header(b), aborted=False)
    return m


def rules(offset_map: OffsetMap, now: int = NOW, last: dict[int, int] | None = None) -> CleanRules:
    return CleanRules(offset_map, now, RETENTION, last or {})


def records_of(data) -> list[tuple[int, int, bytes | None, bytes | None]]:
    buf = bytes(data)
    assert crc_ok(buf, 0, read_header(buf))
    return [(r.offset, r.timestamp, r.key, r.value) for r in decode_batch_records(buf)]


def test_raw_records_reencode_byte_identical():
    b = batch([(b"k1", b"v1"), (None, b"v2"), (b"k3", None)], 0)
    h = read_header(b)
    recs = list(walk(records_section(b, h), h.record_count))
    assert [(r.key, r.value_is_null) for r in recs] == [(b"k1", False), (None, False), (b"k3", True)]
    assert b"".join(encode(r, r.timestamp_delta) for r in recs) == bytes(b[61:])
    with pytest.raises(RawRecordError):
        list(walk(records_section(b, h), h.record_count + 1))


@pytest.mark.parametrize("codec", [COMPRESSION_NONE, COMPRESSION_ZSTD])
def test_only_the_latest_record_of_each_key_stays_with_its_offset(codec):
    first = batch([(b"k1", b"a"), (b"k2", b"b"), (b"k3", b"c")], 0, compression=codec)
    second = batch([(b"k1", b"a2"), (b"k3", b"c2")], 3, compression=codec)
    m = mapped(first, second)
    tracker = TransactionTracker([])
    out = filter_batch(first, rules(m), tracker)
    assert (out.records_kept, out.records_removed) == (1, 2)
    h = read_header(out.data)
    assert (h.base_offset, h.last_offset, h.record_count, h.compression) == (0, 2, 1, codec)  # last offset kept
    assert records_of(out.data) == [(1, T0 + 1, b"k2", b"b")]
    again = filter_batch(second, rules(m), tracker)
    assert again.data is second  # nothing removed, no horizon: the bytes as they were


def test_keyless_records_go():
    b = batch([(None, b"x"), (b"k", b"y")], 0)
    out = filter_batch(b, rules(mapped(b)), TransactionTracker([]))
    assert records_of(out.data) == [(1, T0 + 1, b"k", b"y")]


def test_a_tombstone_gets_a_delete_horizon_then_goes_after_it():
    put = batch([(b"k", b"v")], 0)
    tomb = batch([(b"k", None), (b"j", b"w")], 1)
    m = mapped(put, tomb)
    assert filter_batch(put, rules(m), TransactionTracker([])).data is None  # superseded by the tombstone
    first = filter_batch(tomb, rules(m), TransactionTracker([]))
    h = read_header(first.data)
    assert h.attributes & DELETE_HORIZON_MASK and h.base_timestamp == NOW + RETENTION
    # The records keep their timestamps although the base timestamp moved to the horizon.
    assert records_of(first.data) == [(1, T0, b"k", None), (2, T0 + 1, b"j", b"w")]
    assert h.max_timestamp == T0 + 1
    cleaned = memoryview(first.data)
    before = filter_batch(cleaned, rules(mapped(cleaned), now=NOW + RETENTION - 1), TransactionTracker([]))
    assert before.data is cleaned  # before the horizon: kept as it is
    after = filter_batch(cleaned, rules(mapped(cleaned), now=NOW + RETENTION), TransactionTracker([]))
    assert records_of(after.data) == [(2, T0 + 1, b"j", b"w")]
    assert read_header(after.data).last_offset == 2


def test_the_last_batch_of_a_producer_stays_empty():
    old = batch([(b"k", b"1"), (b"k", b"2")], 0, producer_id=7, producer_epoch=3, base_sequence=10)
    new = batch([(b"k", b"3")], 2)
    m = mapped(old, new)
    out = filter_batch(old, rules(m, last={7: 1}), TransactionTracker([]))
    h = read_header(out.data)
    assert (h.base_offset, h.last_offset, h.record_count) == (0, 1, 0)
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.last_sequence) == (7, 3, 10, 11)
    assert records_of(out.data) == []
    # Not the producer's last batch: it goes.
    assert filter_batch(old, rules(m, last={7: 5}), TransactionTracker([])).data is None


def test_aborted_data_goes_and_its_marker_leaves_only_after_the_data_and_the_horizon():
    aborted = batch([(b"k", b"bad")], 0, producer_id=5, producer_epoch=0, base_sequence=0, transactional=True)
    ok = batch([(b"j", b"good")], 1)
    abort = memoryview(build_marker(5, 0, False, 0, T0, base_offset=2))
    txn = AbortedTxn(last_offset=2, producer_id=5, first_offset=0, last_stable_offset=2)
    m = mapped(ok)
    # Round 1: the aborted data goes; the marker stays (it met the data) and is indexed.
    t1 = TransactionTracker([txn])
    assert filter_batch(aborted, rules(m), t1).data is None
    assert filter_batch(ok, rules(m), t1).data is ok
    assert filter_batch(abort, rules(m), t1).data is abort
    assert t1.index == [txn]
    # Round 2: no data left: the marker gets its horizon.
    t2 = TransactionTracker([txn])
    out = filter_batch(abort, rules(m), t2)
    h = read_header(out.data)
    assert h.is_control and h.attributes & DELETE_HORIZON_MASK and h.base_timestamp == NOW + RETENTION
    assert t2.index == []
    # Round 3, past the horizon: it goes, unless it set its producer's epoch (no data batch of that epoch left).
    marked = memoryview(out.data)
    late = rules(m, now=NOW + RETENTION + 1)
    assert filter_batch(marked, late, TransactionTracker([txn])).data is None
    epoch_setter = CleanRules(m, NOW + RETENTION + 1, RETENTION, {}, {5: 0})
    assert filter_batch(marked, epoch_setter, TransactionTracker([txn])).data is marked


def test_a_marker_that_bumped_the_epoch_stays_whole_once_due():
    """A producer whose newest entry is a marker of a newer epoch (a coordinator that aborted on a timeout) has no
    data batch of that epoch: its marker of that epoch stays with its record (Kafka keeps an empty batch, which a
    replay skips), so a replica replaying the cleaned log still knows the epoch and fences the older one; a marker
    of an older epoch goes."""
    old_epoch = memoryview(build_marker(5, 2, False, 0, T0, base_offset=2))
    bumped = memoryview(build_marker(5, 3, False, 0, T0, base_offset=3))
    late = NOW + RETENTION + 1

    def due(marker):  # a first clean stamps its horizon; a clean after it applies the rules to a due marker
        stamped = filter_batch(marker, rules(mapped()), TransactionTracker([])).data
        return memoryview(stamped)

    keep = CleanRules(mapped(), late, RETENTION, {}, {5: 3})
    marker = due(bumped)
    kept = filter_batch(marker, keep, TransactionTracker([]))
    assert kept.data is marker and parse_marker(bytes(kept.data)).producer_epoch == 3
    assert filter_batch(due(old_epoch), keep, TransactionTracker([])).data is None
    assert filter_batch(due(bumped), CleanRules(mapped(), late, RETENTION, {}), TransactionTracker([])).data is None


def test_a_commit_marker_stays_while_its_transaction_has_data():
    data = batch([(b"k", b"v")], 0, producer_id=9, producer_epoch=0, base_sequence=0, transactional=True)
    commit = memoryview(build_marker(9, 0, True, 0, T0, base_offset=1))
    m = mapped(data)
    t = TransactionTracker([])
    assert filter_batch(data, rules(m), t).data is data
    assert filter_batch(commit, rules(m), t).data is commit  # its data is still there
    # The data superseded and gone: the marker may go, after its horizon.
    newer = batch([(b"k", b"v2")], 2)
    m2 = mapped(data, newer)
    t2 = TransactionTracker([])
    assert filter_batch(data, rules(m2), t2).data is None
    assert filter_batch(commit, rules(m2), t2).data is commit  # this round still met the data
    out = filter_batch(commit, rules(m2), TransactionTracker([]))
    assert read_header(out.data).attributes & DELETE_HORIZON_MASK


def test_the_offset_map_takes_whole_batches_up_to_its_capacity():
    m = OffsetMap(24 * 10, load_factor=1.0)
    assert m.capacity == 10
    b1 = batch([(b"k%d" % i, b"v") for i in range(8)], 0)
    b2 = batch([(b"x%d" % i, b"v") for i in range(3)], 8)
    assert add_to_map(m, b1, read_header(b1), aborted=False)
    assert not add_to_map(m, b2, read_header(b2), aborted=False)  # 11 keys would not fit: the round ends here
    assert (len(m), m.latest_offset) == (8, 7)
    assert add_to_map(m, b2, read_header(b2), aborted=True)  # aborted data adds nothing
    assert len(m) == 8
