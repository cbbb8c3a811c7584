"""A round of cleaning on a real partition directory (storage/cleaner/segment_cleaner.py) and the crash-safe swap
(swap.py): after a clean the log holds the latest record of every key at its offset; a crash at any step of the
swap recovers to the old segments or to the new ones, never a mix, and the log opens with a full recovery."""

from __future__ import annotations

import os

import pytest

from oncelog.config import load_broker_config
from oncelog.records.batch import read_header
from oncelog.records.builder import build_batch
from oncelog.records.reader import read_batches
from oncelog.storage import segment_swap as swap
from oncelog.storage.cleaner.segment_cleaner import (
    CorruptSegment,
    RoundRequest,
    SourceSegment,
    group_by_size,
    run_round,
)
from oncelog.storage.partition_log import PartitionLog
from oncelog.storage.segment_swap import SCRATCH_DIR

NOW = 1_700_000_000_000
KEYS = 5
ROUNDS = 6  # each key written ROUNDS times, one batch per write


def open_log(directory, clean: bool = True) -> PartitionLog:
    config = load_broker_config().topic_config({"segment.bytes": 400, "cleanup.policy": ["compact"]})
    return PartitionLog.open(directory, "t", 0, config, clean=clean, recovery_point=0, now_ms=lambda: NOW)


def fill(plog: PartitionLog) -> dict[bytes, tuple[int, bytes]]:
    """KEYS keys written ROUNDS times each; {key: (offset, value) of its latest write}."""
    latest = {}
    for r in range(ROUNDS):
        for k in range(KEYS):
            key, value = b"key-%d" % k, b"value-%d-%d" % (k, r)
            buf = build_batch([(key, value, (), NOW - 1000 + r)])
            offset = plog.append(buf, read_header(buf))
            latest[key] = (offset, value)
    return latest


def request(plog: PartitionLog, segment_bytes: int = 1 << 20) -> RoundRequest:
    closed = plog.segments[:-1]
    return RoundRequest(
        directory=plog.directory, segments=tuple(SourceSegment(s.base_offset, s.next_offset, s.size) for s in closed),
        first_dirty=0, first_uncleanable=plog.segments[-1].base_offset, dedupe_buffer_bytes=1 << 20, now_ms=NOW,
        delete_retention_ms=86_400_000, last_batch_of_producer={}, aborted=(), segment_bytes=segment_bytes,
        max_index_bytes=10 << 20, index_interval_bytes=4096)


def records(plog: PartitionLog) -> list[tuple[int, bytes | None, bytes | None]]:
    out = []
    for seg in plog.segments:
        for b in read_batches(os.pread(seg.fd, seg.size, 0)):
            out += [(r.offset, r.key, r.value) for r in b.records]
    return out


def expected(before, active_base):
    """What a clean below `active_base` leaves: there, the newest record of each key below it (the map covers
    only the cleanable range, as Kafka's); from it on, everything."""
    newest = {}
    for offset, key, _value in before:
        if offset < active_base:
            newest[key] = offset
    return [r for r in before if r[0] >= active_base or newest[r[1]] == r[0]]


def swap_in(plog_dir: str, groups, *, stop_after: str | None = None) -> None:
    """The loop side of a swap on files (the log object is closed), stopping after step `stop_after`."""
    for group in groups:
        swap.stage(plog_dir, [group])
        if stop_after == "stage":
            return
        swap.commit(plog_dir, [group])
        if stop_after == "commit":
            return
        for base in group.source_bases:
            for suffix in (".log", ".index", ".timeindex", ".txnindex"):
                path = os.path.join(plog_dir, f"{base:020d}{suffix}")
                if os.path.exists(path):
                    os.unlink(path)
            if stop_after == "delete-one":
                return
        swap.finish(plog_dir, [group])


@pytest.fixture
def cleaned(tmp_path):
    plog = open_log(tmp_path / "t-0")
    latest = fill(plog)
    before = records(plog)
    active_base = plog.segments[-1].base_offset
    result = run_round(request(plog))
    directory = plog.directory
    plog.close()
    return directory, before, latest, active_base, result


def test_a_round_keeps_the_latest_record_of_every_key_at_its_offset(cleaned):
    directory, before, latest, active_base, result = cleaned
    assert result.end_offset == active_base and len(result.groups) == 1  # small segments grouped into one
    assert result.records_removed > 0
    swap_in(directory, result.groups)
    plog = open_log(directory, clean=False)
    try:
        after = records(plog)
    finally:
        plog.close()
    expect = expected(before, active_base)
    assert after == expect
    for key, (offset, value) in latest.items():
        assert (offset, key, value) in after
    assert not os.path.exists(os.path.join(directory, SCRATCH_DIR)) or not os.listdir(
        os.path.join(directory, SCRATCH_DIR))


@pytest.mark.parametrize("stop_after,new", [(None, None), ("stage", False), ("commit", True),
                                            ("delete-one", True)])
def test_a_crash_at_each_step_of_the_swap_recovers_old_or_new(cleaned, stop_after, new):
    directory, before, latest, active_base, result = cleaned
    expect_new = expected(before, active_base)
    if stop_after is None:  # a crash before any swap step: only scratch files exist
        pass
    else:
        swap_in(directory, result.groups, stop_after=stop_after)
    swap.recover(directory)
    assert not os.path.exists(os.path.join(directory, SCRATCH_DIR))
    assert not [n for n in os.listdir(directory) if n.endswith((".swap", ".swapend"))]
    plog = open_log(directory, clean=False)
    try:
        assert records(plog) == (expect_new if new else before)
    finally:
        plog.close()


def test_recover_is_idempotent_after_a_partial_finish(cleaned):
    directory, before, latest, active_base, result = cleaned
    swap_in(directory, result.groups, stop_after="commit")
    group = result.groups[0]
    for base in group.source_bases:
        for suffix in (".log", ".index", ".timeindex"):
            path = os.path.join(directory, f"{base:020d}{suffix}")
            if os.path.exists(path):
                os.unlink(path)
    # Step 5 cut after the .index rename: the final .index is the new one, the .log still a .swap.
    os.replace(os.path.join(directory, f"{group.base_offset:020d}.index.swap"),
               os.path.join(directory, f"{group.base_offset:020d}.index"))
    swap.recover(directory)
    swap.recover(directory)
    plog = open_log(directory, clean=False)
    try:
        assert records(plog) == expected(before, active_base)
    finally:
        plog.close()


def test_a_damaged_batch_makes_the_round_fail_with_a_clear_error(tmp_path):
    plog = open_log(tmp_path / "t-0")
    fill(plog)
    req = request(plog)
    first = plog.segments[0]
    path = os.path.join(plog.directory, f"{first.base_offset:020d}.log")
    plog.close()
    data = bytearray(open(path, "rb").read())
    data[-1] ^= 0xFF
    open(path, "wb").write(data)
    with pytest.raises(CorruptSegment, match="fails its CRC"):
        run_round(req)


def test_groups_stay_under_segment_bytes():
    segs = [SourceSegment(i * 10, i * 10 + 10, 300) for i in range(7)]
    groups = group_by_size(segs, 1000, 10 << 20)
    assert [[s.base_offset for s in g] for g in groups] == [[0, 10, 20], [30, 40, 50], [60]]


def test_a_round_swapped_group_by_group_stops_where_the_log_changed(tmp_path):
    """The cleaner swaps a round's groups one call at a time (the event loop free in between): each call needs
    the generation the previous one returned; a stale one swaps nothing more and drops the scratch files, and
    the log holds the cleaned groups swapped so far and the rest as it was, every newest record in place."""
    from oncelog.storage.segment_swap import SwapGroup

    plog = open_log(tmp_path / "t-0")
    try:
        latest = fill(plog)
        before = records(plog)
        result = run_round(request(plog, segment_bytes=400))  # no grouping: one group per source segment
        assert len(result.groups) >= 3
        g0, g1 = result.groups[:2]
        gen0 = plog.generation
        gen1 = plog.replace_segments([(g0.source_bases, SwapGroup(g0.base_offset, g0.next_offset))], gen0, last=False)
        assert gen1 is not None and gen1 != gen0
        assert os.listdir(os.path.join(plog.directory, SCRATCH_DIR))  # the other groups wait there
        # A stale generation (something else changed the segments meanwhile): nothing more is swapped.
        assert plog.replace_segments([(g1.source_bases, SwapGroup(g1.base_offset, g1.next_offset))], gen0,
                                     last=False) is None
        assert not os.path.exists(os.path.join(plog.directory, SCRATCH_DIR))
        after = records(plog)
    finally:
        plog.close()
    cleaned_part = [r for r in before if r[0] < g0.next_offset]
    assert [r for r in after if r[0] >= g0.next_offset] == [r for r in before if r[0] >= g0.next_offset]
    assert len([r for r in after if r[0] < g0.next_offset]) < len(cleaned_part)
    for key, (offset, value) in latest.items():
        assert (offset, key, value) in after


@pytest.mark.parametrize("stop_after,new", [("stage", False), ("commit", True), ("delete-one", True)])
def test_a_chunk_of_groups_is_swapped_whole_or_not_at_all(tmp_path, stop_after, new):
    """Several groups swapped with one set of steps (one .swapend listing them all): a crash before the commit
    leaves every old segment, after it every new one."""
    plog = open_log(tmp_path / "t-0")
    fill(plog)
    before = records(plog)
    active_base = plog.segments[-1].base_offset
    result = run_round(request(plog, segment_bytes=400))  # one group per source segment
    directory = plog.directory
    plog.close()
    groups = [swap.SwapGroup(g.base_offset, g.next_offset) for g in result.groups]
    assert len(groups) >= 3
    swap.stage(directory, groups)
    if stop_after != "stage":
        swap.commit(directory, groups)
        (marker,) = [n for n in os.listdir(directory) if n.endswith(".swapend")]
        assert marker == f"{groups[0].base_offset:020d}.swapend"
        if stop_after == "delete-one":
            base = result.groups[1].source_bases[0]
            for suffix in (".log", ".index", ".timeindex"):
                os.unlink(os.path.join(directory, f"{base:020d}{suffix}"))
    assert swap.recover(directory) == (len(groups) if new else 0)
    assert not [n for n in os.listdir(directory) if n.endswith((".swap", ".swapend"))]
    plog = open_log(directory, clean=False)
    try:
        assert records(plog) == (expected(before, active_base) if new else before)
    finally:
        plog.close()


def test_a_commit_marker_of_one_group_in_the_older_format_is_finished(cleaned):
    """A `.swapend` holding one number (written before chunks) is one group at the file's base."""
    directory, before, latest, active_base, result = cleaned
    (group,) = result.groups
    swap.stage(directory, [group])
    marker = os.path.join(directory, f"{group.base_offset:020d}.swapend")
    with open(marker, "w") as f:
        f.write(str(group.next_offset))
    assert swap.recover(directory) == 1
    plog = open_log(directory, clean=False)
    try:
        assert records(plog) == expected(before, active_base)
    finally:
        plog.close()
