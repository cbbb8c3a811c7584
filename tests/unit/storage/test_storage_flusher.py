"""Group commit: one fsync round for many logs and waiters; the high watermark moves only after it."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from oncelog.errors import ErrorCode, KafkaError
from oncelog.storage.flusher import GroupCommitFlusher


class GatedExecutor(ThreadPoolExecutor):
    """Runs the fsync call only once the test opens the gate, so the test can act during a round. With
    `only_first`, only the first call waits for the gate and later ones run at once."""

    def __init__(self, workers: int = 1, only_first: bool = False) -> None:
        super().__init__(max_workers=workers)
        self.gate = threading.Event()
        self.calls = 0
        self.only_first = only_first

    def submit(self, fn, /, *args, **kwargs):
        self.calls += 1
        wait = not self.only_first or self.calls == 1

        def gated():
            if wait:
                self.gate.wait(5)
            return fn(*args, **kwargs)

        return super().submit(gated)


def test_one_round_for_two_logs_and_many_waiters(open_log, append, tmp_path):
    logs = [open_log(fsync=True), open_log(fsync=True, directory=tmp_path / "u-0")]
    notified = []

    async def main():
        flusher = GroupCommitFlusher(fsync_enabled=True, on_high_watermark=notified.append)
        for plog in logs:
            plog.on_dirty = flusher.mark_dirty
        flusher.start()
        waits = []
        for i in range(20):
            plog = logs[i % 2]
            base, _ = append(plog, count=2)
            waits.append(flusher.wait_durable(plog, base + 2))
        assert [p.high_watermark for p in logs] == [0, 0]
        assert logs[0].read(0, 1 << 20).size == 0  # not durable, not visible
        await asyncio.wait_for(asyncio.gather(*waits), 5)
        assert [p.high_watermark for p in logs] == [20, 20]
        assert flusher.rounds == 1 and flusher.synced_fds == 2
        assert set(notified) == set(logs)
        await flusher.stop()

    asyncio.run(main())


def test_writes_during_an_fsync_go_into_the_next_round(open_log, append):
    plog = open_log(fsync=True)
    executor = GatedExecutor()

    async def main():
        flusher = GroupCommitFlusher(fsync_enabled=True, executor=executor)
        plog.on_dirty = flusher.mark_dirty
        flusher.start()
        append(plog)
        first = asyncio.ensure_future(flusher.wait_durable(plog, 1))
        while executor.calls == 0:
            await asyncio.sleep(0.001)
        append(plog)  # during the first round's fsync
        second = asyncio.ensure_future(flusher.wait_durable(plog, 2))
        await asyncio.sleep(0.01)
        assert plog.high_watermark == 0 and not first.done()
        executor.gate.set()
        await asyncio.wait_for(first, 5)
        assert plog.high_watermark >= 1
        await asyncio.wait_for(second, 5)
        assert plog.high_watermark == 2 and flusher.rounds == 2
        await flusher.stop()

    try:
        asyncio.run(main())
    finally:
        executor.shutdown()


def test_fsync_disabled_moves_high_watermark_at_append(open_log, append):
    plog = open_log(fsync=False)
    notified = []

    async def main():
        flusher = GroupCommitFlusher(fsync_enabled=False, on_high_watermark=notified.append)
        plog.on_dirty = flusher.mark_dirty
        flusher.start()
        append(plog)
        assert plog.high_watermark == 1
        await flusher.wait_durable(plog, 1)
        await asyncio.sleep(0.01)
        assert notified == [plog] and flusher.synced_fds == 0
        await flusher.stop()

    asyncio.run(main())


def test_fsync_error_takes_the_log_offline(open_log, append):
    plog = open_log(fsync=True)

    async def main():
        flusher = GroupCommitFlusher(fsync_enabled=True)
        plog.on_dirty = flusher.mark_dirty
        flusher.start()
        append(plog)
        read_end, write_end = os.pipe()
        os.dup2(read_end, plog.segments[0].fd)  # fdatasync on a pipe fails with EINVAL
        os.close(read_end)
        os.close(write_end)
        with pytest.raises(KafkaError) as info:
            await asyncio.wait_for(flusher.wait_durable(plog, 1), 5)
        assert info.value.code == ErrorCode.KAFKA_STORAGE_ERROR
        assert plog.offline and plog.high_watermark == 0
        with pytest.raises(KafkaError) as info:
            append(plog)
        assert info.value.code == ErrorCode.KAFKA_STORAGE_ERROR
        with pytest.raises(KafkaError):
            await flusher.wait_durable(plog, 1)
        await flusher.stop()

    asyncio.run(main())


def test_forget_fails_waiters_of_a_deleted_log(open_log, append):
    plog = open_log(fsync=True)

    async def main():
        flusher = GroupCommitFlusher(fsync_enabled=True)
        append(plog)
        waiter = asyncio.ensure_future(flusher.wait_durable(plog, 1))
        await asyncio.sleep(0)
        flusher.forget(plog)
        with pytest.raises(KafkaError) as info:
            await waiter
        assert info.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    asyncio.run(main())


def test_a_log_turning_dirty_during_another_logs_round_starts_its_own(open_log, append, tmp_path):
    """oncelog.fsync.threads=2: log B's waiter is answered while log A's round still hangs in its fsync; A's
    next bytes wait for A's own round (one round per log at a time) and get a round after it."""
    a, b = open_log(fsync=True), open_log(fsync=True, directory=tmp_path / "u-0")
    executor = GatedExecutor(workers=2, only_first=True)

    async def main():
        flusher = GroupCommitFlusher(fsync_enabled=True, executor=executor, sync_threads=2)
        a.on_dirty = b.on_dirty = flusher.mark_dirty
        flusher.start()
        append(a)
        first_a = asyncio.ensure_future(flusher.wait_durable(a, 1))
        while executor.calls == 0:
            await asyncio.sleep(0.001)
        append(b)
        await asyncio.wait_for(flusher.wait_durable(b, 1), 5)  # not behind A's hanging round
        append(a)  # during A's round: must not start a second round of A
        second_a = asyncio.ensure_future(flusher.wait_durable(a, 2))
        await asyncio.sleep(0.05)
        assert executor.calls == 2 and not first_a.done() and a.high_watermark == 0
        executor.gate.set()
        await asyncio.wait_for(first_a, 5)
        await asyncio.wait_for(second_a, 5)
        assert a.high_watermark == 2 and b.high_watermark == 1
        assert executor.calls == 3 and flusher.rounds == 3
        await flusher.stop()

    try:
        asyncio.run(main())
    finally:
        executor.shutdown()


def test_a_round_keeps_each_logs_error(tmp_path):
    """One log's failed sync does not fail the others of its round, and every fd is closed."""
    from oncelog.storage.flusher import _sync_all

    paths = [tmp_path / f"f{i}" for i in range(4)]
    fds = [os.open(p, os.O_CREAT | os.O_WRONLY, 0o644) for p in paths]
    dir_fd = os.open(tmp_path, os.O_RDONLY)
    bad = os.open(tmp_path / "bad", os.O_CREAT | os.O_WRONLY, 0o644)
    os.close(bad)  # a closed fd: its fdatasync fails with EBADF
    groups = [([fds[0], fds[1]], [dir_fd]), ([bad], []), ([fds[2]], []), ([fds[3]], [])]
    results = _sync_all(groups)
    assert [r is None for r in results] == [True, False, True, True]
    assert results[1].errno == 9  # EBADF
    for fd in (*fds, dir_fd):
        with pytest.raises(OSError):
            os.fstat(fd)  # closed by the round


def test_a_round_starts_every_files_writeback_before_its_first_fdatasync(tmp_path, monkeypatch):
    """storage/writeback.py: with two or more files in a round, each file's writeback is started before the
    first fdatasync (one journal commit for the round); each file is still fdatasynced."""
    from oncelog.storage import flusher, writeback

    assert writeback.AVAILABLE or not os.uname().sysname == "Linux"
    fds = [os.open(tmp_path / f"f{i}", os.O_CREAT | os.O_WRONLY, 0o644) for i in range(3)]
    for fd in fds:
        os.write(fd, b"x" * 1500)
    events: list[tuple[str, int]] = []
    real_fdatasync = os.fdatasync
    monkeypatch.setattr(flusher, "start_writeback", lambda batch: events.extend(("start", fd) for fd in batch))
    monkeypatch.setattr(os, "fdatasync", lambda fd: (events.append(("sync", fd)), real_fdatasync(fd))[1])
    assert flusher._sync_all([([fds[0], fds[1]], []), ([fds[2]], [])]) == [None, None]
    assert events == [("start", fds[0]), ("start", fds[1]), ("start", fds[2]),
                      ("sync", fds[0]), ("sync", fds[1]), ("sync", fds[2])]
    events.clear()
    one = os.open(tmp_path / "f0", os.O_WRONLY)
    assert flusher._sync_all([([one], [])]) == [None]
    assert events == [("sync", one)]  # a single file: nothing to gain


def test_start_writeback_leaves_errors_to_fdatasync(tmp_path):
    from oncelog.storage.writeback import start_writeback

    fd = os.open(tmp_path / "f", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b"x" * 4096)
    start_writeback([fd, 987654])  # a bad fd: no exception here
    os.fdatasync(fd)
    os.close(fd)


def test_a_bug_while_starting_a_round_does_not_stop_the_flusher(open_log, append, tmp_path, monkeypatch):
    """A log whose flush targets raise something unexpected is logged; the flusher lives on and serves the next
    round of the other logs."""
    broken, fine = open_log(fsync=True), open_log(fsync=True, directory=tmp_path / "u-0")

    async def main():
        flusher = GroupCommitFlusher(fsync_enabled=True)
        broken.on_dirty = fine.on_dirty = flusher.mark_dirty
        flusher.start()
        monkeypatch.setattr(broken, "flush_targets", lambda: (_ for _ in ()).throw(RuntimeError("bug")))
        append(broken)
        await asyncio.sleep(0.05)
        append(fine)
        await asyncio.wait_for(flusher.wait_durable(fine, 1), 5)
        await flusher.stop()

    asyncio.run(main())


def test_a_slow_round_is_logged_with_the_disks_share(open_log, append, tmp_path, monkeypatch, caplog,
                                                     topic_config, clock):
    """oncelog.fsync.slow.round.ms: a round over the threshold is one WARNING naming the disk's time and the
    slowest log; every round reaches `on_round`. A round slow on the disk and one slow before the disk (the
    flush thread busy: here a gate) are told apart by the disk's share."""
    from oncelog.storage.partition_log import PartitionLog

    quick = open_log(fsync=True)
    slow = PartitionLog.open(tmp_path / "slow-0", "slow", 0, topic_config(), recovery_point=0, log_start_offset=0,
                             clean=True, now_ms=clock, fsync=True)
    real_fdatasync = os.fdatasync
    slow_fds: set[int] = set()

    def fdatasync(fd: int) -> None:
        if fd in slow_fds:  # once: the flusher closes its fds after the round, and their numbers come back
            slow_fds.discard(fd)
            time.sleep(0.08)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    executor = GatedExecutor(only_first=True)
    rounds = []

    async def main():
        flusher = GroupCommitFlusher(fsync_enabled=True, executor=executor, on_round=rounds.append,
                                     slow_round_ms=50)
        slow.on_dirty = quick.on_dirty = flusher.mark_dirty
        real_targets = slow.flush_targets

        def targets():
            found = real_targets()
            slow_fds.update(found.fds)
            return found

        monkeypatch.setattr(slow, "flush_targets", targets)
        flusher.start()
        append(quick)
        first = asyncio.ensure_future(flusher.wait_durable(quick, 1))
        while executor.calls == 0:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.08)  # the round waits for the flush thread (the gate), not for the disk
        executor.gate.set()
        await asyncio.wait_for(first, 5)
        append(slow)
        append(quick)
        await asyncio.wait_for(asyncio.gather(flusher.wait_durable(slow, 1), flusher.wait_durable(quick, 2)), 5)
        append(quick)
        await asyncio.wait_for(flusher.wait_durable(quick, 3), 5)
        await flusher.stop()
        slow.close()

    with caplog.at_level(logging.WARNING, logger="oncelog.storage.flusher"):
        asyncio.run(main())
    assert len(rounds) == 3
    gated, disk, fast = rounds
    assert gated.round_s >= 0.08 and gated.disk_s < 0.05 and gated.files == 1
    assert disk.round_s >= 0.08 and disk.disk_s >= 0.08 and disk.slowest == "slow-0" and disk.slowest_s >= 0.08
    assert disk.files == 2
    assert fast.round_s < 0.05
    lines = [r.getMessage() for r in caplog.records if "fsync round took" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "slowest log slow-0 " in lines[1] and "2 files of 2 logs" in lines[1]
    disk_ms = float(lines[1].split("the disk ")[1].split(" ms")[0])
    assert disk_ms >= 80
    assert float(lines[0].split("the disk ")[1].split(" ms")[0]) < 50


def test_no_slow_round_line_at_threshold_zero(open_log, append, monkeypatch, caplog):
    plog = open_log(fsync=True)
    real_fdatasync = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (time.sleep(0.06), real_fdatasync(fd))[1])

    async def main():
        flusher = GroupCommitFlusher(fsync_enabled=True, slow_round_ms=0)
        plog.on_dirty = flusher.mark_dirty
        flusher.start()
        append(plog)
        await asyncio.wait_for(flusher.wait_durable(plog, 1), 5)
        await flusher.stop()

    with caplog.at_level(logging.WARNING, logger="oncelog.storage.flusher"):
        asyncio.run(main())
    assert not [r for r in caplog.records if "fsync round took" in r.getMessage()]
