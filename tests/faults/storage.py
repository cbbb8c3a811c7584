"""Storage faults for tests and the runner: a size-limited tmpfs data directory that can be filled up, and the
broker's fsync-failure trigger file (`oncelog.test.fail.fsync.file`, a test-only key).

A full disk is real: a tmpfs mount of a few MiB plus a ballast file that takes every free page. Mounting needs
privileges; where `mount` is refused, `SmallDisk.mount` raises `DiskUnavailable` with the reason, and callers skip.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

FSYNC_TRIGGER_KEY = "oncelog.test.fail.fsync.file"
_CHUNK = 64 * 1024


class DiskUnavailable(RuntimeError):
    """A size-limited file system could not be mounted here."""


class SmallDisk:
    """A tmpfs of `size_mb` at `path`; `fill()` takes all its free space, `free()` gives it back."""

    def __init__(self, path: str | os.PathLike, size_mb: int) -> None:
        self.path = Path(path)
        self.size_mb = size_mb
        self.mounted = False
        self.ballast = self.path / "ballast"

    def mount(self) -> SmallDisk:
        self.path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m", "tmpfs", str(self.path)],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise DiskUnavailable(f"cannot mount a {self.size_mb} MiB tmpfs: {done.stderr.strip() or done.returncode}")
        self.mounted = True
        return self

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True, check=False)
            self.mounted = False

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self) -> int:
        """Write the ballast until the file system says ENOSPC; returns the ballast's size."""
        chunk = b"\0" * _CHUNK
        written = 0
        with open(self.ballast, "ab", buffering=0) as f:
            while True:
                try:
                    n = f.write(chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    if len(chunk) == 1:
                        break
                    chunk = chunk[: len(chunk) // 2]  # take the last partial pages too
                    continue
                written += n or 0
        return written

    def free(self) -> None:
        self.ballast.unlink(missing_ok=True)

    def __enter__(self) -> SmallDisk:
        return self.mount()

    def __exit__(self, *exc: object) -> None:
        self.free()
        self.unmount()


class FsyncTrigger:
    """The trigger file of a broker started with `{FSYNC_TRIGGER_KEY: str(trigger.path)}`."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    @property
    def setting(self) -> dict[str, str]:
        return {FSYNC_TRIGGER_KEY: str(self.path)}

    def arm(self) -> None:
        self.path.touch()

    def disarm(self) -> None:
        self.path.unlink(missing_ok=True)
