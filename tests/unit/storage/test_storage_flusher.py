"""Group commit: one fsync round for many logs and waiters; the high watermark moves only after it."""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from oncelog.errors import ErrorCode, KafkaError
from oncelog.storage.flusher import GroupCommitFlusher


class GatedExecutor(ThreadPoolExecutor):
    """Runs the fsync call only once the test opens the gate, so the test can act during a round."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.gate = threading.Event()
        self.calls = 0

    def submit(self, fn, /, *args, **kwargs):
        self.calls += 1

        def gated():
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


def test_a_round_syncs_logs_side_by_side_and_keeps_each_logs_error(tmp_path):
    """oncelog.fsync.threads: the logs of one round are synced side by side; each log still gets its own result
    and every fd is closed, also when another log's sync fails."""
    from oncelog.storage.flusher import _sync_all

    paths = [tmp_path / f"f{i}" for i in range(4)]
    fds = [os.open(p, os.O_CREAT | os.O_WRONLY, 0o644) for p in paths]
    dir_fd = os.open(tmp_path, os.O_RDONLY)
    bad = os.open(tmp_path / "bad", os.O_CREAT | os.O_WRONLY, 0o644)
    os.close(bad)  # a closed fd: its fdatasync fails with EBADF
    groups = [([fds[0], fds[1]], [dir_fd]), ([bad], []), ([fds[2]], []), ([fds[3]], [])]
    seen: list[str] = []
    fanout = ThreadPoolExecutor(max_workers=4)
    real = os.fdatasync

    def tracking(fd: int) -> None:
        seen.append(threading.current_thread().name)
        real(fd)

    try:
        os.fdatasync = tracking
        results = _sync_all(groups, fanout)
    finally:
        os.fdatasync = real
        fanout.shutdown()
    assert [r is None for r in results] == [True, False, True, True]
    assert results[1].errno == 9  # EBADF
    assert len(set(seen)) > 1  # more than one thread synced
    for fd in (*fds, dir_fd):
        with pytest.raises(OSError):
            os.fstat(fd)  # closed by the round
    # one group, or no fan-out: inline, same results
    fd = os.open(paths[0], os.O_WRONLY)
    assert _sync_all([([fd], [])], None) == [None]
