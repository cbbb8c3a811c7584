"""Committed and pending offsets of one group: visibility, ordering by log position, expiry."""

from __future__ import annotations

from oncelog.coordinator.group.offsets import CommittedOffset, GroupOffsets

TP = ("t", 0)


def value(offset: int, log_offset: int, ts: int = 0, expire: int = -1) -> CommittedOffset:
    return CommittedOffset(offset, -1, "", ts, expire, log_offset)


def test_later_write_wins_regardless_of_arrival_order():
    o = GroupOffsets()
    assert o.put(TP, value(10, log_offset=5))
    assert not o.put(TP, value(7, log_offset=3))  # written earlier, applied late
    assert o.committed[TP].offset == 10
    assert o.put(TP, value(12, log_offset=6))


def test_staged_offsets_are_invisible_until_commit():
    o = GroupOffsets()
    o.put(TP, value(1, 0))
    o.stage(7, TP, value(50, 1))
    assert o.committed[TP].offset == 1
    assert o.is_unstable(TP) and o.has_pending_from(7)
    assert o.complete(7, commit=True) == 1
    assert o.committed[TP].offset == 50
    assert not o.is_unstable(TP) and not o.has_pending_from(7)


def test_abort_drops_staged_offsets():
    o = GroupOffsets()
    o.stage(7, TP, value(50, 1))
    assert o.complete(7, commit=False) == 0
    assert TP not in o.committed and not o.is_unstable(TP)


def test_plain_commit_after_the_txn_write_beats_the_txn_commit():
    o = GroupOffsets()
    o.stage(7, TP, value(50, log_offset=1))
    o.put(TP, value(60, log_offset=2))  # a plain commit written after the TxnOffsetCommit
    o.complete(7, commit=True)
    assert o.committed[TP].offset == 60


def test_in_flight_commits_are_unstable():
    o = GroupOffsets()
    o.begin_commit([TP, TP])
    o.end_commit([TP])
    assert o.is_unstable(TP)
    o.end_commit([TP])
    assert not o.is_unstable(TP) and not o.has_offsets


def test_unstage_leaves_a_newer_staged_value():
    o = GroupOffsets()
    first = value(1, 1)
    o.stage(7, TP, first)
    second = value(2, 2)
    o.stage(7, TP, second)
    o.unstage(7, {TP: first})
    assert o.pending_txn[7][TP] is second
    o.unstage(7, {TP: second})
    assert not o.has_pending_from(7)


def test_remove_drops_committed_and_staged():
    o = GroupOffsets()
    o.put(TP, value(1, 0))
    o.stage(7, TP, value(2, 1))
    o.stage(7, ("t", 1), value(3, 2))
    assert o.remove([TP]) == [TP]
    assert o.pending_txn == {7: {("t", 1): o.pending_txn[7][("t", 1)]}}


def test_expiry_rules():
    o = GroupOffsets()
    o.put(("a", 0), value(1, 0, ts=100))
    o.put(("b", 0), value(1, 1, ts=100))
    o.put(("c", 0), value(1, 2, ts=100, expire=10_000))  # explicit expiry wins over retention
    o.begin_commit([("d", 0)])
    o.put(("d", 0), value(1, 3, ts=100))

    def since_commit(v: CommittedOffset) -> int:
        return v.commit_timestamp

    assert sorted(o.expired(1100, 1000, since_commit)) == [("a", 0), ("b", 0)]
    assert o.expired(1099, 1000, since_commit) == []
    assert o.expired(1100, 1000, since_commit, keep_topics={"a"}) == [("b", 0)]
    assert sorted(o.expired(10_000, 1000, since_commit)) == [("a", 0), ("b", 0), ("c", 0)]
