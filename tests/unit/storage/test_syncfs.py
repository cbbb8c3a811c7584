"""oncelog.fsync.method=syncfs (storage/syncfs.py): one syncfs per filesystem for a round of several files, every
file fdatasynced after all when it fails, and refused where syncfs would not report an I/O error."""

from __future__ import annotations

import errno
import logging
import os

import pytest

from oncelog.broker.server import Broker
from oncelog.config import ConfigError, load_broker_config
from oncelog.storage import flusher, syncfs


def _files(tmp_path, count: int) -> list[int]:
    fds = []
    for i in range(count):
        fd = os.open(tmp_path / f"f{i}", os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(fd, b"x" * 1500)
        fds.append(fd)
    return fds


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


@pytest.fixture
def calls(monkeypatch):
    """Every syncfs and fdatasync the round makes, in order (both still done for real)."""
    events: list[tuple[str, int]] = []
    real_syncfs, real_fdatasync = syncfs._syncfs, os.fdatasync
    assert real_syncfs is not None, "Linux only"

    def counted_syncfs(fd: int) -> int:
        events.append(("syncfs", fd))
        return real_syncfs(fd)

    monkeypatch.setattr(syncfs, "_syncfs", counted_syncfs)
    monkeypatch.setattr(os, "fdatasync", lambda fd: (events.append(("fdatasync", fd)), real_fdatasync(fd))[1])
    return events


def test_a_round_of_several_files_is_one_syncfs(tmp_path, calls):
    fds = _files(tmp_path, 3)
    dir_fd = os.open(tmp_path, os.O_RDONLY)
    seconds: list[float] = []
    results = flusher._sync_all([([fds[0], fds[1]], [dir_fd]), ([fds[2]], [])], seconds, use_syncfs=True)
    assert results == [None, None]
    assert calls == [("syncfs", fds[0])]  # one filesystem: one call, through the first fd
    assert all(_closed(fd) for fd in (*fds, dir_fd))
    assert len(seconds) == 3 and seconds[0] > 0 and seconds[1:] == [0.0, 0.0]


def test_a_round_of_one_file_is_a_fdatasync(tmp_path, calls):
    (fd,) = _files(tmp_path, 1)
    assert flusher._sync_all([([fd], [])], use_syncfs=True) == [None]
    assert calls == [("fdatasync", fd)]


def test_without_the_method_every_file_is_fdatasynced(tmp_path, calls):
    fds = _files(tmp_path, 2)
    assert flusher._sync_all([([fds[0]], []), ([fds[1]], [])]) == [None, None]
    assert calls == [("fdatasync", fds[0]), ("fdatasync", fds[1])]


def test_a_failed_syncfs_sends_each_file_to_its_own_fdatasync(tmp_path, calls, monkeypatch):
    """syncfs cannot say whose error it was: each log learns its own from its files' fdatasyncs."""
    fds = _files(tmp_path, 2)
    bad = os.open(tmp_path / "bad", os.O_CREAT | os.O_WRONLY, 0o644)
    os.close(bad)  # its fdatasync fails with EBADF: the one log with an error
    monkeypatch.setattr(flusher, "sync_filesystems", lambda fds: OSError(errno.EIO, "injected"))
    results = flusher._sync_all([([fds[0]], []), ([bad], []), ([fds[1]], [])], use_syncfs=True)
    assert [r is None for r in results] == [True, False, True]
    assert results[1].errno == errno.EBADF
    assert calls == [("fdatasync", fds[0]), ("fdatasync", bad), ("fdatasync", fds[1])]
    assert all(_closed(fd) for fd in fds)


def test_an_injected_fsync_failure_fails_every_log_of_a_syncfs_round(tmp_path, calls):
    """oncelog.test.fail.fsync.file reaches syncfs rounds as it reaches fdatasync ones."""
    from oncelog.storage import fault_injection

    trigger = tmp_path / "fail"
    trigger.touch()
    fault_injection.configure(str(trigger))
    try:
        fds = _files(tmp_path, 2)
        results = flusher._sync_all([([fds[0]], []), ([fds[1]], [])], use_syncfs=True)
    finally:
        fault_injection.configure(None)
    assert [r.errno for r in results] == [errno.EIO, errno.EIO]
    assert calls == []  # neither syncfs nor fdatasync ran
    assert all(_closed(fd) for fd in fds)


def test_sync_filesystems_reports_a_bad_fd(tmp_path):
    bad = os.open(tmp_path / "bad", os.O_CREAT | os.O_WRONLY, 0o644)
    os.close(bad)
    error = syncfs.sync_filesystems([bad])
    assert isinstance(error, OSError) and error.errno == errno.EBADF


@pytest.mark.parametrize(("release", "version"), [("6.18.44-fc-v769", (6, 18)), ("5.8.0", (5, 8)),
                                                  ("5.4.0-150-generic", (5, 4)), ("4.19", (4, 19)), ("x", (0, 0))])
def test_kernel_version(release, version):
    assert syncfs.kernel_version(release) == version


def test_syncfs_is_refused_at_start_before_linux_5_8(monkeypatch, caplog):
    config = load_broker_config(overrides=["oncelog.fsync.method=syncfs"])
    assert Broker._use_syncfs(config) is True
    monkeypatch.setattr(syncfs.platform, "release", lambda: "5.4.0-150-generic")
    with pytest.raises(ConfigError, match="only from Linux 5.8 on; this kernel is 5.4.0-150-generic"):
        Broker._use_syncfs(config)
    with caplog.at_level(logging.WARNING, logger="oncelog.broker"):
        assert Broker._use_syncfs(load_broker_config(overrides=["oncelog.fsync.method=syncfs",
                                                                "oncelog.fsync.enable=false"])) is False
    assert any("oncelog.fsync.method=syncfs has no effect" in r.getMessage() for r in caplog.records)
    assert Broker._use_syncfs(load_broker_config()) is False
    with pytest.raises(ConfigError, match="must be one of fdatasync, syncfs"):
        load_broker_config(overrides=["oncelog.fsync.method=fsync"])


def test_a_slow_syncfs_round_is_logged_as_one_syncfs(open_log, append, tmp_path, monkeypatch, caplog):
    import asyncio
    import logging
    import time

    from oncelog.storage.flusher import GroupCommitFlusher

    logs = [open_log(fsync=True), open_log(fsync=True, directory=tmp_path / "u-0")]
    real_syncfs = syncfs._syncfs
    monkeypatch.setattr(syncfs, "_syncfs", lambda fd: (time.sleep(0.03), real_syncfs(fd))[1])
    rounds = []

    async def main():
        flusher = GroupCommitFlusher(fsync_enabled=True, use_syncfs=True, slow_round_ms=20, on_round=rounds.append)
        for plog in logs:
            plog.on_dirty = flusher.mark_dirty
        flusher.start()
        for plog in logs:
            append(plog)
        await asyncio.wait_for(asyncio.gather(*(flusher.wait_durable(plog, 1) for plog in logs)), 5)
        await flusher.stop()

    with caplog.at_level(logging.WARNING, logger="oncelog.storage.flusher"):
        asyncio.run(main())
    (timing,) = rounds
    assert timing.disk_s >= 0.03 and timing.slowest == "" and timing.files >= 2
    (line,) = [r.getMessage() for r in caplog.records if "fsync round took" in r.getMessage()]
    assert "(one syncfs for the round " in line and "of 2 logs" in line, line
