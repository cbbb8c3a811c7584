"""Kafka-format offset checkpoint files (`recovery-point-offset-checkpoint`, `log-start-offset-checkpoint`).

Format, as Kafka writes it: a version line (0), a count line, then one `<topic> <partition> <offset>` line per
partition. Written atomically (temp file, fsync, rename, fsync of the directory) because a torn checkpoint
would either skip recovery of unflushed data or resurrect deleted records.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import NamedTuple

from ..durable_file import atomic_write, fsync_dir

__all__ = ["atomic_write", "fsync_dir"]  # kept here too: storage's callers name them from this module

VERSION = 0

RECOVERY_POINT_FILE = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_FILE = "log-start-offset-checkpoint"


class CorruptCheckpointError(ValueError):
    """A checkpoint file that does not parse; the message names the file and the line."""


def write_checkpoint(path: str | os.PathLike, offsets: Mapping[tuple[str, int], int]) -> None:
    lines = [str(VERSION), str(len(offsets))]
    lines += [f"{topic} {partition} {offset}" for (topic, partition), offset in sorted(offsets.items())]
    atomic_write(path, ("\n".join(lines) + "\n").encode())


class CheckpointLines(NamedTuple):
    """The entry lines of a Kafka-format checkpoint file (line numbers start at 3) and how to report one bad."""

    entries: list[str]
    bad: Callable[[int, str], CorruptCheckpointError]


def read_checkpoint_lines(path: str | os.PathLike, what: str) -> CheckpointLines | None:
    """Kafka's checkpoint framing (a version line, a count line, then the entries), shared by the offset
    checkpoints and the leader-epoch checkpoint; None when the file does not exist. `what` names the file kind in
    errors ("checkpoint file", "leader epoch checkpoint")."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        raise CorruptCheckpointError(f"{what[0].upper()}{what[1:]} {path} is not text: {exc}") from None
    lines = text.splitlines()

    def bad(line_no: int, why: str) -> CorruptCheckpointError:
        shown = lines[line_no - 1] if 0 < line_no <= len(lines) else ""
        return CorruptCheckpointError(f"Malformed {what} {path}, line {line_no} ({shown!r}): {why}")

    if len(lines) < 2:
        raise bad(len(lines) + 1, "missing version or count line")
    if lines[0].strip() != str(VERSION):
        raise bad(1, f"unsupported version (expected {VERSION})")
    try:
        count = int(lines[1])
    except ValueError:
        raise bad(2, "count is not a number") from None
    entries = lines[2:]
    if count < 0 or len(entries) != count:
        raise bad(2, f"count {count} but {len(entries)} entries follow")
    return CheckpointLines(entries, bad)


def read_checkpoint(path: str | os.PathLike) -> dict[tuple[str, int], int]:
    """{(topic, partition): offset}; empty when the file does not exist."""
    framed = read_checkpoint_lines(path, "checkpoint file")
    if framed is None:
        return {}
    entries, bad = framed
    result: dict[tuple[str, int], int] = {}
    for i, line in enumerate(entries, start=3):
        parts = line.split()
        if len(parts) != 3:
            raise bad(i, "expected '<topic> <partition> <offset>'")
        try:
            partition, offset = int(parts[1]), int(parts[2])
        except ValueError:
            raise bad(i, "partition and offset must be integers") from None
        if partition < 0:
            raise bad(i, "negative partition")
        result[(parts[0], partition)] = offset
    return result
