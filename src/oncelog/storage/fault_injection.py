"""Test-only fault injection inside the real broker: failing fsyncs on demand.

A failed fsync cannot be provoked on demand on an ordinary file system (tmpfs never fails one, and a
device-mapper error target needs privileges CI does not have), yet it is the storage fault whose handling
matters most: after it the kernel may have dropped the dirty pages, so the written-but-unsynced tail of the log
must never be acknowledged. `oncelog.test.fail.fsync.file` names a trigger file; while that file exists, every
fsync of partition data (the group-commit flusher's and the synchronous ones before snapshots and at close)
raises EIO instead of syncing. The broker's own error handling then runs exactly as it would for a real EIO.
Unset (the default) costs nothing: one `None` check per fsync round.
"""

from __future__ import annotations

import errno
import os

_trigger: str | None = None


def configure(trigger_file: str | None) -> None:
    """Arm (a path) or disarm (None or empty) the fsync fault for this process."""
    global _trigger
    _trigger = trigger_file or None


def check_fsync() -> None:
    """Raise EIO when the fsync fault is armed and its trigger file exists; called before each fsync."""
    trigger = _trigger
    if trigger is not None and os.path.exists(trigger):
        raise OSError(errno.EIO, f"injected fsync failure (trigger file {trigger} exists)")


# Crash points: `oncelog.test.crash.at` names one step of a multi-step file operation (the cleaner's swap:
# swap-staged, swap-committed, swap-old-deleted); the broker SIGKILLs itself the moment it gets there, so a test
# can show that the next start recovers from a crash at exactly that step. Unset: one `None` check per step.
_crash_at: str | None = None


def configure_crash(point: str | None) -> None:
    global _crash_at
    _crash_at = point or None


def crash_point(name: str) -> None:
    if _crash_at is not None and _crash_at == name:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
