"""A segment roll's producer-state snapshot (docs/latency.md): written inside the append that rolls, on the loop,
with no fsync there; its fsyncs (and the directory's) go into the log's next flush round. A snapshot a crash
left torn or ahead of the log is not trusted at load."""

from __future__ import annotations

import os

from oncelog.storage.partition import Partition
from oncelog.storage.producer_state import decode_snapshot


def test_a_roll_writes_the_snapshot_without_fsync_and_leaves_its_sync_to_the_next_round(open_log, append,
                                                                                        monkeypatch):
    part = Partition(open_log(fsync=True, segment_bytes=1024))
    plog = part.log
    append(plog, count=5, value_size=100)
    plog.flush_targets().close()  # as if a round covered what is there
    plog.mark_flushed(plog.log_end_offset)
    assert not plog.dirty
    syncs: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: syncs.append(fd))
    monkeypatch.setattr(os, "fdatasync", lambda fd: syncs.append(fd))
    base, _ = append(plog, count=5, value_size=100)  # over segment.bytes: rolls before this batch
    assert len(plog.segments) == 2 and base == 5
    assert syncs == [], "nothing synced on the appending (loop) thread"
    assert part.producers.list_snapshots() == [5]
    assert decode_snapshot(part.producers.snapshot_path(5).read_bytes()) == []
    monkeypatch.undo()
    assert plog.dirty
    targets = plog.flush_targets()
    try:
        names = {os.readlink(f"/proc/self/fd/{fd}") for fd in targets.fds}
        assert str(part.producers.snapshot_path(5)) in names  # the snapshot's fsync is the round's
        assert targets.dir_fds, "and the directory's, for its rename"
    finally:
        targets.close()


def test_a_snapshot_ahead_of_the_recovered_log_is_dropped_and_an_older_one_used(open_log, append, tmp_path):
    """What a crash before that round can leave: the new snapshot on disk, the log behind it."""
    part = Partition(open_log(fsync=False))
    append(part.log, count=3)
    part.producers.write_snapshot(3)
    append(part.log, count=3)
    fd = part.producers.write_snapshot(part.log.log_end_offset + 10, sync=False)  # ahead of the log
    assert fd is not None
    os.close(fd)
    part.producers.load_latest_snapshot(part.log.log_end_offset)
    assert part.producers.list_snapshots() == [3]
