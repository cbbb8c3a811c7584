"""The leader-epoch cache of one partition replica: which leader epoch wrote which offsets.

Replication truncates by it (KIP-101, KIP-279): a follower asks the leader for the end offset of its own latest
epoch (OffsetsForLeaderEpoch) and cuts its log there, instead of trusting its high watermark, which can lose
acknowledged records or keep divergent ones after two quick leader changes. Each entry is (epoch, start offset):
the first offset written in that epoch; the epoch's end is the next entry's start, or the log end for the latest.

On disk it is Kafka's `leader-epoch-checkpoint` file in the partition directory: a version line (0), a count line,
then one `<epoch> <start offset>` line per entry. Every change is written at once and atomically (temp file, fsync,
rename, directory fsync): changes happen at leader changes and truncations, not per batch, and a follower that
restarts with a stale cache would truncate to the wrong offset. Kafka flushes truncations in the background and
repairs the cache at log load; `Partition` repairs it at load too (truncate to the log's ends), which covers a
file from before a crash that the log does not match.

Entries are kept with both epochs and start offsets strictly increasing; `assign` enforces it the way Kafka's
LeaderEpochFileCache does (a new entry removes every later-or-equal epoch and every entry starting at or after
it). Runs on the event-loop thread, like the log.
"""

from __future__ import annotations

import logging
import os
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from typing import NamedTuple

from .checkpoints import VERSION, atomic_write, read_checkpoint_lines

LEADER_EPOCH_CHECKPOINT_FILE = "leader-epoch-checkpoint"
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1

log = logging.getLogger(__name__)


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int


class LeaderEpochCache:
    """The cache of the partition directory `directory`, loaded from its checkpoint file unless `load` is False;
    raises `CorruptCheckpointError` for an unreadable file (then `rebuild` from the log)."""

    def __init__(self, directory: str | os.PathLike, name: str = "", load: bool = True) -> None:
        self.path = os.path.join(os.fspath(directory), LEADER_EPOCH_CHECKPOINT_FILE)
        self.name = name
        self._entries: list[EpochEntry] = []
        self._epochs: list[int] = []  # the entries' epochs, for bisect
        if load:
            self._set(read_leader_epoch_checkpoint(self.path))

    # -- reading --------------------------------------------------------------------------------------------
    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def latest_epoch(self) -> int:
        """The newest epoch with an entry, or UNDEFINED_EPOCH (-1) for an empty cache."""
        return self._entries[-1].epoch if self._entries else UNDEFINED_EPOCH

    @property
    def latest_entry(self) -> EpochEntry | None:
        return self._entries[-1] if self._entries else None

    @property
    def earliest_entry(self) -> EpochEntry | None:
        return self._entries[0] if self._entries else None

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """OffsetsForLeaderEpoch: (largest epoch <= `epoch`, end offset of that epoch).

        The end offset is the start offset of the first epoch above `epoch`, or `log_end_offset` when `epoch` is
        the latest. (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET) when `epoch` is undefined, above every known epoch
        or the cache is empty. For an epoch below the first known one the answer is (`epoch`, start of the first
        entry), as Kafka answers since KAFKA-7415: those offsets were deleted here, so the follower should cut
        back to where this log's known history begins and fetch from there.
        """
        if epoch == UNDEFINED_EPOCH or not self._entries:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if epoch == self._entries[-1].epoch:
            return epoch, log_end_offset
        higher = bisect_right(self._epochs, epoch)
        if higher == len(self._entries):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if higher == 0:
            return epoch, self._entries[0].start_offset
        return self._entries[higher - 1].epoch, self._entries[higher].start_offset

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch that wrote `offset` (the last entry starting at or before it), or UNDEFINED_EPOCH."""
        best = UNDEFINED_EPOCH
        for entry in self._entries:
            if entry.start_offset > offset:
                break
            best = entry.epoch
        return best

    # -- changes (each persisted before returning) ----------------------------------------------------------
    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that `epoch` starts at `start_offset`; True if the cache changed (and was written).

        Nothing changes for the latest epoch at the same or a later start. Otherwise entries of epochs >= `epoch`
        and entries starting at or after `start_offset` are removed first, so a newer epoch whose first offset
        is not above the previous entry's (a leader that wrote nothing in its epoch) replaces that entry.
        Callers pass a newer epoch than `latest_epoch` (a batch from a new leader, or becoming leader at the log
        end). ValueError for a negative epoch or offset.
        """
        if not self._assign(EpochEntry(epoch, start_offset)):
            return False
        self._write()
        return True

    def truncate_from_end(self, end_offset: int) -> bool:
        """The log was cut to end before `end_offset`: remove entries starting at or after it."""
        if end_offset < 0 or not self._entries or self._entries[-1].start_offset < end_offset:
            return False
        keep = bisect_left([e.start_offset for e in self._entries], end_offset)
        removed = self._entries[keep:]
        self._set(self._entries[:keep])
        log.debug("%s: leader epochs %s removed by truncation to %d", self.name, removed, end_offset)
        self._write()
        return True

    def truncate_from_start(self, start_offset: int) -> bool:
        """The log start offset moved to `start_offset`: the last entry starting at or before it now starts
        there, and the entries before it go (the entry at exactly `start_offset` stays as it is)."""
        if not self._entries or self._entries[0].start_offset >= start_offset:
            return False
        covering = bisect_right([e.start_offset for e in self._entries], start_offset) - 1
        kept = [EpochEntry(self._entries[covering].epoch, start_offset), *self._entries[covering + 1:]]
        if kept == self._entries:
            return False
        self._set(kept)
        self._write()
        return True

    def clear(self) -> None:
        """Forget every entry (a replica that empties its log and starts again at another offset)."""
        if not self._entries and not os.path.exists(self.path):
            return
        self._set([])
        self._write()

    def rebuild(self, batches: Iterable[tuple[int, int]]) -> None:
        """Replace the entries with those implied by (partition leader epoch, base offset) of each batch in
        log order, as Kafka's appends assign them: an entry wherever a batch carries a newer epoch. For a
        checkpoint file that could not be read."""
        self._set([])
        for epoch, base_offset in batches:
            if epoch >= 0 and epoch > self.latest_epoch:
                self._assign(EpochEntry(epoch, base_offset))
        self._write()

    # -- internals -----------------------------------------------------------------------------------------
    def _assign(self, entry: EpochEntry) -> bool:
        if entry.epoch < 0 or entry.start_offset < 0:
            raise ValueError(f"{self.name}: invalid leader epoch entry {entry}")
        latest = self.latest_entry
        if latest is not None and entry.epoch == latest.epoch and entry.start_offset >= latest.start_offset:
            return False
        keep = len(self._entries)
        while keep and (self._entries[keep - 1].epoch >= entry.epoch
                        or self._entries[keep - 1].start_offset >= entry.start_offset):
            keep -= 1
        removed = self._entries[keep:]
        if len(removed) > 1 or (removed and removed[0].start_offset != entry.start_offset):
            # One entry at the same start offset is a leader that wrote nothing in its epoch: expected.
            log.warning("%s: leader epoch %s removes the conflicting entries %s", self.name, entry, removed)
        self._set([*self._entries[:keep], entry])
        return True

    def _set(self, entries: list[EpochEntry]) -> None:
        self._entries = entries
        self._epochs = [e.epoch for e in entries]

    def _write(self) -> None:
        write_leader_epoch_checkpoint(self.path, self._entries)

    def __repr__(self) -> str:
        return f"LeaderEpochCache({self.name}, {self._entries})"


def write_leader_epoch_checkpoint(path: str | os.PathLike, entries: Iterable[tuple[int, int]]) -> None:
    items = list(entries)
    lines = [str(VERSION), str(len(items)), *(f"{epoch} {start}" for epoch, start in items)]
    atomic_write(path, ("\n".join(lines) + "\n").encode())


def read_leader_epoch_checkpoint(path: str | os.PathLike) -> list[EpochEntry]:
    """The entries of a `leader-epoch-checkpoint` file; empty when it does not exist."""
    framed = read_checkpoint_lines(path, "leader epoch checkpoint")
    if framed is None:
        return []
    lines, bad = framed
    entries: list[EpochEntry] = []
    for i, line in enumerate(lines, start=3):
        parts = line.split()
        if len(parts) != 2:
            raise bad(i, "expected '<epoch> <start offset>'")
        try:
            epoch, start = int(parts[0]), int(parts[1])
        except ValueError:
            raise bad(i, "epoch and start offset must be integers") from None
        if epoch < 0 or start < 0:
            raise bad(i, "negative epoch or start offset")
        if entries and (epoch <= entries[-1].epoch or start <= entries[-1].start_offset):
            raise bad(i, "epochs and start offsets must increase")
        entries.append(EpochEntry(epoch, start))
    return entries
