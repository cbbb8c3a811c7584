"""One broker process per data directory: an exclusive lock on `<data dir>/.lock` for the life of the process.

Two brokers on one directory would append to the same segments and overwrite each other's checkpoints, which no
later recovery can undo. As Kafka does with its `.lock` file, a broker takes the lock before it opens anything and
refuses to start without it. The lock is the kernel's (flock): it goes with the process, however the process ends,
so a restart after a kill -9 finds it free.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_FILE = ".lock"


class DataDirInUse(OSError):
    """Another process holds the data directory's lock."""


def lock_data_dir(data_dir: Path) -> int:
    """Take the lock (creating the directory if needed); returns the descriptor that holds it. Raises DataDirInUse
    at once if another process holds it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DataDirInUse(f"data directory {data_dir} is in use by another process (it holds {path})") from None
    return fd
