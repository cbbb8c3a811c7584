"""LeaderEpochCache on real files: Kafka's `leader-epoch-checkpoint` format, assign / truncate rules of Kafka's
LeaderEpochFileCache, OffsetsForLeaderEpoch answers (KIP-101, KIP-279, KAFKA-7415), and damaged files."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oncelog.storage.checkpoints import CorruptCheckpointError
from oncelog.storage.leader_epochs import (
    LEADER_EPOCH_CHECKPOINT_FILE,
    UNDEFINED_EPOCH,
    EpochEntry,
    LeaderEpochCache,
    read_leader_epoch_checkpoint,
)

UNDEFINED = (UNDEFINED_EPOCH, -1)


def file_text(directory) -> str:
    with open(os.path.join(directory, LEADER_EPOCH_CHECKPOINT_FILE), encoding="utf-8") as f:
        return f.read()


def cache_with(tmp_path, *entries: tuple[int, int]) -> LeaderEpochCache:
    cache = LeaderEpochCache(tmp_path, "t-0")
    for epoch, start in entries:
        assert cache.assign(epoch, start)
    return cache


def test_empty_cache_writes_nothing_and_answers_undefined(tmp_path):
    cache = LeaderEpochCache(tmp_path, "t-0")
    assert cache.latest_epoch == UNDEFINED_EPOCH and cache.latest_entry is None and cache.entries() == []
    assert cache.end_offset_for(0, 10) == UNDEFINED
    assert cache.epoch_for_offset(5) == UNDEFINED_EPOCH
    assert not cache.truncate_from_end(0) and not cache.truncate_from_start(5)
    assert not os.path.exists(tmp_path / LEADER_EPOCH_CHECKPOINT_FILE)


def test_assign_writes_kafkas_format_and_survives_reopen(tmp_path):
    cache_with(tmp_path, (0, 0), (3, 10), (7, 25))
    assert file_text(tmp_path) == "0\n3\n0 0\n3 10\n7 25\n"
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    again = LeaderEpochCache(tmp_path, "t-0")
    assert again.entries() == [EpochEntry(0, 0), EpochEntry(3, 10), EpochEntry(7, 25)]
    assert again.latest_epoch == 7 and again.earliest_entry == (0, 0)


def test_same_epoch_at_a_later_offset_changes_nothing(tmp_path):
    cache = cache_with(tmp_path, (1, 0), (2, 10))
    before = os.stat(tmp_path / LEADER_EPOCH_CHECKPOINT_FILE).st_ino
    assert not cache.assign(2, 10) and not cache.assign(2, 15)
    assert cache.entries() == [(1, 0), (2, 10)]
    assert os.stat(tmp_path / LEADER_EPOCH_CHECKPOINT_FILE).st_ino == before  # not rewritten


def test_same_epoch_at_an_earlier_offset_moves_its_start(tmp_path):
    cache = cache_with(tmp_path, (1, 0), (2, 10))
    assert cache.assign(2, 6)
    assert cache.entries() == [(1, 0), (2, 6)]
    assert LeaderEpochCache(tmp_path).entries() == [(1, 0), (2, 6)]


def test_newer_epoch_not_above_the_last_start_replaces_it(tmp_path):
    """A leader that wrote nothing in its epoch: the next epoch starts at the same offset and replaces it."""
    cache = cache_with(tmp_path, (1, 0), (2, 10))
    assert cache.assign(3, 10)
    assert cache.entries() == [(1, 0), (3, 10)]
    assert cache.assign(4, 5)  # below the last start: every entry starting at or after 5 goes
    assert cache.entries() == [(1, 0), (4, 5)]
    assert LeaderEpochCache(tmp_path).entries() == [(1, 0), (4, 5)]


def test_older_epoch_removes_the_newer_ones_as_kafka_does(tmp_path):
    cache = cache_with(tmp_path, (1, 0), (3, 10), (5, 20))
    assert cache.assign(4, 25)
    assert cache.entries() == [(1, 0), (3, 10), (4, 25)]


@pytest.mark.parametrize("epoch, start", [(-1, 0), (0, -1)])
def test_invalid_entries_are_refused(tmp_path, epoch, start):
    cache = cache_with(tmp_path, (1, 0))
    with pytest.raises(ValueError):
        cache.assign(epoch, start)
    assert cache.entries() == [(1, 0)]


@pytest.mark.parametrize("requested, expected", [
    (5, (5, 30)),  # the latest epoch: the log end
    (4, (3, 20)),  # between epochs: the largest epoch below, ended by the next one's start
    (3, (3, 20)),
    (2, (1, 10)),
    (1, (1, 10)),
    (0, (0, 0)),  # below the first epoch: the first start offset (KAFKA-7415)
    (6, UNDEFINED),  # above every epoch
    (UNDEFINED_EPOCH, UNDEFINED),
])
def test_end_offset_for(tmp_path, requested, expected):
    cache = cache_with(tmp_path, (1, 0), (3, 10), (5, 20))
    assert cache.end_offset_for(requested, 30) == expected


def test_epoch_for_offset(tmp_path):
    cache = cache_with(tmp_path, (1, 5), (3, 10), (5, 20))
    assert [cache.epoch_for_offset(o) for o in (0, 5, 9, 10, 19, 20, 99)] == [-1, 1, 1, 3, 3, 5, 5]


def test_truncate_from_end(tmp_path):
    cache = cache_with(tmp_path, (1, 0), (3, 10), (5, 20))
    assert not cache.truncate_from_end(21)  # the latest epoch starts below: nothing to do
    assert cache.truncate_from_end(20)
    assert cache.entries() == [(1, 0), (3, 10)]
    assert not cache.truncate_from_end(15)
    assert cache.truncate_from_end(5)
    assert cache.entries() == [(1, 0)]
    assert LeaderEpochCache(tmp_path).entries() == [(1, 0)]
    assert cache.truncate_from_end(0)
    assert cache.entries() == [] and file_text(tmp_path) == "0\n0\n"


def test_truncate_from_start(tmp_path):
    cache = cache_with(tmp_path, (1, 0), (3, 10), (5, 20))
    assert cache.truncate_from_start(10)  # the entry starting exactly there stays
    assert cache.entries() == [(3, 10), (5, 20)]
    assert not cache.truncate_from_start(10) and not cache.truncate_from_start(4)
    assert cache.truncate_from_start(15)  # the epoch covering 15 now starts there
    assert cache.entries() == [(3, 15), (5, 20)]
    assert cache.truncate_from_start(27)
    assert cache.entries() == [(5, 27)]
    assert LeaderEpochCache(tmp_path).entries() == [(5, 27)]


def test_clear_persists_an_empty_cache(tmp_path):
    cache = cache_with(tmp_path, (1, 0), (3, 10))
    cache.clear()
    assert cache.entries() == [] and file_text(tmp_path) == "0\n0\n"
    assert LeaderEpochCache(tmp_path).entries() == []


def test_rebuild_from_batch_epochs(tmp_path):
    cache = LeaderEpochCache(tmp_path, load=False)
    cache.rebuild([(-1, 0), (0, 1), (0, 4), (2, 7), (1, 9), (2, 12), (4, 13)])
    assert cache.entries() == [(0, 1), (2, 7), (4, 13)]
    assert LeaderEpochCache(tmp_path).entries() == cache.entries()


@pytest.mark.parametrize("text, why", [
    ("", "missing version"),
    ("1\n0\n", "unsupported version"),
    ("0\nx\n", "count is not a number"),
    ("0\n2\n1 0\n", "count 2 but 1"),
    ("0\n1\n1\n", "expected '<epoch> <start offset>'"),
    ("0\n1\n1 a\n", "must be integers"),
    ("0\n1\n-1 0\n", "negative"),
    ("0\n2\n3 10\n2 20\n", "must increase"),
    ("0\n2\n2 10\n3 10\n", "must increase"),
])
def test_damaged_file_is_refused_with_the_line(tmp_path, text, why):
    (tmp_path / LEADER_EPOCH_CHECKPOINT_FILE).write_text(text)
    with pytest.raises(CorruptCheckpointError, match=why):
        LeaderEpochCache(tmp_path)


def test_binary_file_is_refused(tmp_path):
    (tmp_path / LEADER_EPOCH_CHECKPOINT_FILE).write_bytes(b"\xff\xfe\x00")
    with pytest.raises(CorruptCheckpointError):
        read_leader_epoch_checkpoint(tmp_path / LEADER_EPOCH_CHECKPOINT_FILE)


def test_a_leftover_temp_file_does_not_matter(tmp_path):
    cache_with(tmp_path, (1, 0), (2, 10))
    (tmp_path / (LEADER_EPOCH_CHECKPOINT_FILE + ".tmp")).write_text("0\n1\n9 99")  # a write cut by a crash
    assert LeaderEpochCache(tmp_path).entries() == [(1, 0), (2, 10)]


_ops = st.lists(st.one_of(
    st.tuples(st.just("assign"), st.integers(0, 12), st.integers(0, 60)),
    st.tuples(st.just("end"), st.integers(0, 60)),
    st.tuples(st.just("start"), st.integers(0, 60)),
), max_size=25)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_ops)
def test_any_sequence_keeps_the_cache_ordered_and_persisted(tmp_path_factory, ops):
    directory = tmp_path_factory.mktemp("epochs")
    cache = LeaderEpochCache(directory)
    for op in ops:
        if op[0] == "assign":
            cache.assign(op[1], op[2])
            assert cache.latest_entry == (op[1], op[2]) or (
                cache.latest_epoch == op[1] and cache.latest_entry.start_offset <= op[2])
        elif op[0] == "end":
            cache.truncate_from_end(op[1])
            assert all(e.start_offset < op[1] for e in cache.entries())
        else:
            cache.truncate_from_start(op[1])
            assert all(e.start_offset >= op[1] for e in cache.entries())
        entries = cache.entries()
        for a, b in zip(entries, entries[1:], strict=False):
            assert a.epoch < b.epoch and a.start_offset < b.start_offset
        if os.path.exists(cache.path):
            assert LeaderEpochCache(directory).entries() == entries
        else:
            assert entries == []
        # every epoch but the latest ends where the next begins; the latest at the log end
        for a, b in zip(entries, entries[1:], strict=False):
            assert cache.end_offset_for(a.epoch, 100) == (a.epoch, b.start_offset)
        if entries:
            assert cache.end_offset_for(entries[-1].epoch, 100) == (entries[-1].epoch, 100)
