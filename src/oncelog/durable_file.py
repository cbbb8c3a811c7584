"""Files replaced so that a crash leaves either the old or the new content, durably: checkpoints, snapshots, and
the small JSON stores of security (ACLs, SCRAM credentials, quotas) and broker metadata.

A room of its own on the ground floor (no imports from the package), so that both storage/ and security/ use it
without one of them reaching up into the other.
"""

from __future__ import annotations

import os


def fsync_dir(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new content, durably. `mode`: the
    file's permissions (0o600 for secrets: set before anything is written)."""
    path = os.fspath(path)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        if mode != 0o644:
            os.fchmod(fd, mode)  # a left-over .tmp keeps the mode it was created with
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def replace_unsynced(path: str | os.PathLike, data: bytes) -> int:
    """Replace `path` with `data` without waiting for the disk, and return a read-only fd of the new file for the
    caller to fsync later (and close), together with the directory. Until then a crash may leave the old file,
    the new one, or a torn new one: only for files whose reader checks them (a CRC) and falls back to an older
    copy, such as producer-state snapshots."""
    path = os.fspath(path)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
