"""PartitionLog for replication, on real files: follower truncation (whole batches, segments and indexes, durable,
across a flush round in flight), starting over at another offset, following the leader's log start, and the
replicated high watermark split from the durable end (with the flusher's waiters)."""

from __future__ import annotations

import asyncio
import os

import pytest
from tests.unit.storage.storage_helpers import build_batch

from oncelog.errors import ErrorCode, KafkaError
from oncelog.records.batch import iter_headers
from oncelog.storage import fault_injection
from oncelog.storage.flusher import GroupCommitFlusher
from oncelog.storage.index import OffsetIndex, TimeIndex
from oncelog.storage.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, segment_path

SIZE3 = len(build_batch(3))  # a batch of three records


def flush(plog):
    """One flush round, inline (what the flusher does)."""
    targets = plog.flush_targets()
    for fd in targets.fds:
        os.fdatasync(fd)
    for fd in targets.dir_fds:
        os.fsync(fd)
    targets.close()
    plog.mark_flushed(targets.end_offset)


def read_all(plog, upper_bound=None) -> bytes:
    out = b""
    offset = plog.log_start_offset
    end = plog.high_watermark if upper_bound is None else upper_bound
    while offset < end:
        result = plog.read(offset, 1 << 20, end)
        data = result.data if result.data is not None else os.pread(result.fd, result.length, result.position)
        result.close()
        assert data, f"no progress at {offset}"
        for _, header in iter_headers(data):
            offset = header.next_offset
        out += data
    return out


def fill(plog, append, batches: int, timestamp: int = 1000) -> list[bytes]:
    """`batches` batches of 3 records; returns their bytes as written."""
    return [append(plog, count=3, timestamp=timestamp + 3 * i)[1] for i in range(batches)]


def segment_files(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith((LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)))


def assert_indexes_match(plog) -> None:
    """Every index file on disk points inside its segment and below its next offset."""
    for segment in plog.segments:
        oi = OffsetIndex.load(segment_path(plog.directory, segment.base_offset, INDEX_SUFFIX), segment.base_offset,
                              1 << 20)
        ti = TimeIndex.load(segment_path(plog.directory, segment.base_offset, TIME_INDEX_SUFFIX), segment.base_offset,
                            1 << 20)
        assert oi.problem(max(segment.size, 1), True) is None
        assert all(offset < segment.next_offset and position < segment.size for offset, position in oi.entries())
        assert ti.problem(segment.next_offset, True) is None
        oi.close()
        ti.close()


# -- truncate_to ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fsync", [True, False])
@pytest.mark.parametrize("target, expected_end", [(15, 15), (16, 15), (17, 15), (18, 18), (0, 0)])
def test_truncate_to_cuts_whole_batches(open_log, append, fsync, target, expected_end):
    plog = open_log(fsync=fsync)
    written = fill(plog, append, 10)
    flush(plog)
    assert plog.truncate_to(target) == expected_end
    assert (plog.log_end_offset, plog.high_watermark, plog.durable_end) == (expected_end,) * 3
    assert plog.recovery_point == (expected_end if fsync else 0)
    assert plog.size_bytes == expected_end // 3 * SIZE3 == plog.segments[-1].size
    assert read_all(plog) == b"".join(written[: expected_end // 3])
    assert not plog.dirty
    # the next append continues at the cut
    base, data = append(plog, count=2)
    assert base == expected_end
    flush(plog)
    assert read_all(plog) == b"".join(written[: expected_end // 3]) + data


def test_truncate_at_or_past_the_end_changes_nothing(open_log, append):
    plog = open_log()
    written = fill(plog, append, 4)
    flush(plog)
    assert plog.truncate_to(12) == 12 and plog.truncate_to(50) == 12
    assert read_all(plog) == b"".join(written)
    with pytest.raises(ValueError):
        plog.truncate_to(-1)


@pytest.mark.parametrize("reopen", ["clean", "crash"])
def test_truncation_across_segments_deletes_files_and_cuts_indexes(open_log, append, crash, reopen):
    # 4 batches per segment, an index entry for nearly every batch
    plog = open_log(segment_bytes=4 * SIZE3, index_interval_bytes=1)
    written = fill(plog, append, 14)
    flush(plog)
    assert [s.base_offset for s in plog.segments] == [0, 12, 24, 36]
    assert plog.truncate_to(20) == 18  # inside the second segment, in the middle of the batch at 18
    assert [s.base_offset for s in plog.segments] == [0, 12]
    assert segment_files(plog.directory) == sorted(
        f"{base:020d}{suffix}" for base in (0, 12) for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX))
    assert os.path.getsize(segment_path(plog.directory, 12, LOG_SUFFIX)) == 2 * SIZE3
    assert_indexes_match(plog)
    assert read_all(plog) == b"".join(written[:6])
    # timestamps: the cut batches are gone from the time index too
    assert plog.offset_for_timestamp(1000 + 3 * 5) == (15, 1000 + 3 * 5 + 2)
    assert plog.offset_for_timestamp(1000 + 3 * 6) is None
    more = fill(plog, append, 5, timestamp=5000)
    flush(plog)
    assert read_all(plog) == b"".join(written[:6] + more)
    if reopen == "crash":
        crash(plog)
    else:
        plog.close()
    again = open_log(clean=reopen == "clean", segment_bytes=4 * SIZE3, index_interval_bytes=1)
    assert again.log_end_offset == 33
    assert not any(s.rebuilt for s in again.segments) or reopen == "crash"
    assert read_all(again) == b"".join(written[:6] + more)
    assert_indexes_match(again)


def test_truncation_at_a_segment_base_drops_that_segment(open_log, append):
    plog = open_log(segment_bytes=4 * SIZE3)
    written = fill(plog, append, 10)
    flush(plog)
    assert [s.base_offset for s in plog.segments] == [0, 12, 24]
    assert plog.truncate_to(12) == 12
    assert [s.base_offset for s in plog.segments] == [0]
    assert not os.path.exists(segment_path(plog.directory, 12, LOG_SUFFIX))
    base, _ = append(plog, count=3)  # the old first segment is the active one again, full: it rolls
    assert base == 12 and [s.base_offset for s in plog.segments] == [0, 12]
    flush(plog)
    assert read_all(plog)[: 4 * SIZE3] == b"".join(written[:4])


def test_truncation_below_the_first_segment_starts_over(open_log, append):
    plog = open_log(segment_bytes=4 * SIZE3)
    fill(plog, append, 10)
    flush(plog)
    plog.delete_records_before(24)
    assert [s.base_offset for s in plog.segments] == [24]
    assert plog.truncate_to(20) == 20
    assert (plog.log_start_offset, plog.log_end_offset, plog.high_watermark) == (20, 20, 20)
    assert segment_files(plog.directory) == [f"{20:020d}{s}" for s in (INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX)]


def test_truncation_below_the_log_start_brings_it_down(open_log, append):
    """As Kafka: the log cannot start after its end."""
    plog = open_log()
    fill(plog, append, 5)
    flush(plog)
    assert plog.delete_records_before(7) == 7
    assert plog.truncate_to(4) == 3
    assert (plog.log_start_offset, plog.log_end_offset) == (3, 3)


def test_truncation_is_durable_and_drops_unsynced_bytes_cleanly(open_log, append):
    plog = open_log(fsync=True)
    written = fill(plog, append, 4)
    flush(plog)
    written += fill(plog, append, 4)  # not flushed
    assert (plog.durable_end, plog.log_end_offset) == (12, 24)
    assert plog.truncate_to(18) == 18
    assert (plog.durable_end, plog.high_watermark, plog.recovery_point) == (18, 18, 18)
    assert not plog.dirty
    assert read_all(plog) == b"".join(written[:6])


def test_a_flush_round_in_flight_does_not_cover_appends_after_a_truncation(open_log, append):
    plog = open_log(fsync=True)
    fill(plog, append, 4)
    targets = plog.flush_targets()  # a round starts, covering offsets up to 12
    assert targets.end_offset == 12
    plog.truncate_to(6)
    fill(plog, append, 4)  # 6..17, after the round's fds were taken
    for fd in targets.fds:
        os.fdatasync(fd)
    targets.close()
    plog.mark_flushed(targets.end_offset)  # the round ends: 12 is not durable in the new log
    assert plog.durable_end == plog.high_watermark == 6
    flush(plog)
    assert plog.durable_end == plog.high_watermark == 18


def test_a_failed_fsync_during_truncation_takes_the_log_offline(open_log, append, tmp_path):
    plog = open_log(fsync=True)
    fill(plog, append, 4)
    flush(plog)
    trigger = tmp_path / "fail-fsync"
    trigger.touch()
    fault_injection.configure(str(trigger))
    try:
        with pytest.raises(KafkaError) as info:
            plog.truncate_to(6)
    finally:
        fault_injection.configure(None)
    assert info.value.code == ErrorCode.KAFKA_STORAGE_ERROR and plog.offline
    with pytest.raises(KafkaError):
        plog.truncate_to(3)


# -- truncate_fully_and_start_at -------------------------------------------------------------------------------
@pytest.mark.parametrize("offset", [100, 5, 0])
def test_truncate_fully_and_start_at(open_log, append, offset):
    plog = open_log(fsync=True, segment_bytes=4 * SIZE3)
    fill(plog, append, 10)
    flush(plog)
    plog.roll()
    plog.truncate_fully_and_start_at(offset)
    assert (plog.log_start_offset, plog.log_end_offset, plog.high_watermark, plog.durable_end,
            plog.recovery_point, plog.size_bytes) == (offset, offset, offset, offset, offset, 0)
    assert segment_files(plog.directory) == [f"{offset:020d}{s}" for s in (INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX)]
    assert not plog.dirty
    base, data = append(plog, count=3)
    assert base == offset
    flush(plog)
    assert read_all(plog) == data
    plog.close()
    again = open_log(fsync=True, log_start_offset=offset, segment_bytes=4 * SIZE3)
    assert (again.log_start_offset, again.log_end_offset) == (offset, offset + 3)
    assert read_all(again) == data


# -- advance_log_start -----------------------------------------------------------------------------------------
def test_advance_log_start_follows_the_leader_but_never_back(open_log, append):
    plog = open_log(fsync=True, segment_bytes=4 * SIZE3)
    fill(plog, append, 10)
    flush(plog)
    assert plog.advance_log_start(14) == 14
    assert [s.base_offset for s in plog.segments] == [12, 24]
    assert plog.advance_log_start(9) == 14  # never backwards
    with pytest.raises(KafkaError) as info:
        plog.read(13, 100)
    assert info.value.code == ErrorCode.OFFSET_OUT_OF_RANGE
    assert plog.read(14, 1 << 20).first_offset == 12  # the batch holding it


def test_advance_log_start_stops_at_the_durable_end(open_log, append):
    plog = open_log(fsync=True)
    fill(plog, append, 4)
    flush(plog)
    fill(plog, append, 4)  # 12..23, not durable
    assert plog.advance_log_start(20) == 12
    flush(plog)
    assert plog.advance_log_start(20) == 20
    assert plog.advance_log_start(99) == 24  # never past the end


def test_advance_log_start_raises_a_lagging_high_watermark(open_log, append):
    plog = open_log(fsync=True)
    fill(plog, append, 4)
    flush(plog)
    plog.use_replicated_high_watermark(3)
    assert plog.advance_log_start(9) == 9
    assert plog.high_watermark == 9


# -- the replicated high watermark -----------------------------------------------------------------------------
def test_replicated_flushes_move_only_the_durable_end(open_log, append):
    plog = open_log(fsync=True)
    written = fill(plog, append, 4)
    flush(plog)
    assert plog.use_replicated_high_watermark(6) == 6  # below the single-node value: the replicas' word counts
    fill(plog, append, 2)
    flush(plog)
    assert (plog.high_watermark, plog.durable_end, plog.log_end_offset) == (6, 18, 18)
    assert plog.recovery_point == 18
    assert read_all(plog) == b"".join(written[:2])  # readers see the high watermark only
    assert not plog.set_high_watermark(5)  # never backwards
    assert plog.set_high_watermark(12) and plog.high_watermark == 12
    assert read_all(plog) == b"".join(written)
    assert plog.set_high_watermark(50) and plog.high_watermark == 18  # never above the durable end
    append(plog)
    assert not plog.set_high_watermark(19)  # appended, not yet durable
    flush(plog)
    assert plog.set_high_watermark(19) and plog.high_watermark == 19


def test_replicated_high_watermark_with_fsync_disabled(open_log, append):
    plog = open_log(fsync=False)
    plog.use_replicated_high_watermark(0)
    fill(plog, append, 2)
    assert (plog.high_watermark, plog.durable_end) == (0, 6)
    assert plog.set_high_watermark(3) and read_all(plog) == read_all(plog, 3)
    assert plog.read(0, 1 << 20).length == SIZE3


def test_initial_replicated_high_watermark_is_clamped(open_log, append):
    plog = open_log(fsync=True)
    fill(plog, append, 4)
    flush(plog)
    plog.delete_records_before(3)
    assert plog.use_replicated_high_watermark(0) == 3
    assert plog.use_replicated_high_watermark(99) == 12


def test_reads_at_a_replicated_high_watermark_inside_a_segment(open_log, append):
    """The zero-copy read bound at the high watermark is right when it moves without a flush round."""
    plog = open_log(fsync=True, index_interval_bytes=1)
    written = fill(plog, append, 30)
    flush(plog)
    plog.use_replicated_high_watermark(0)
    for hw in range(3, 91, 3):
        assert plog.set_high_watermark(hw)
        for start in (0, hw - 3):
            result = plog.read(start, 1 << 20)
            data = result.data if result.data is not None else os.pread(result.fd, result.length, result.position)
            result.close()
            assert data == b"".join(written[start // 3: hw // 3])


def test_truncation_lowers_a_replicated_high_watermark(open_log, append):
    plog = open_log(fsync=True)
    fill(plog, append, 6)
    flush(plog)
    plog.use_replicated_high_watermark(15)
    assert plog.truncate_to(9) == 9
    assert (plog.high_watermark, plog.durable_end) == (9, 9)
    fill(plog, append, 2)
    flush(plog)
    assert (plog.high_watermark, plog.durable_end) == (9, 15)  # replicated: stays until the owner moves it
    assert plog.truncate_to(12) == 12 and plog.high_watermark == 9


def test_single_node_close_moves_everything_to_the_log_end(open_log, append):
    plog = open_log(fsync=True)
    fill(plog, append, 3)
    assert plog.high_watermark == 0
    plog.close()
    assert (plog.high_watermark, plog.durable_end, plog.recovery_point) == (9, 9, 9)


def test_flusher_wakes_replicated_waiters_when_the_owner_moves_the_high_watermark(open_log, append):
    plog = open_log(fsync=True)
    plog.use_replicated_high_watermark(0)
    moved = []

    async def main():
        def on_durable(log):
            moved.append(log.durable_end)

        flusher = GroupCommitFlusher(fsync_enabled=True, on_high_watermark=on_durable)
        plog.on_dirty = flusher.mark_dirty
        flusher.start()
        append(plog, count=3)
        waiter = asyncio.ensure_future(flusher.wait_durable(plog, 3))
        deadline = asyncio.get_running_loop().time() + 5
        while not moved and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.001)
        assert moved == [3]  # the callback fired on the durable end's move
        await asyncio.sleep(0.01)
        assert not waiter.done() and plog.high_watermark == 0  # acks=all waits for the replicas
        assert plog.set_high_watermark(3)
        flusher.high_watermark_moved(plog)
        await asyncio.wait_for(waiter, 5)
        await flusher.stop()

    asyncio.run(main())
