"""Producer state of one partition: the seeds' broker-side rules, in one place.

For every producer id that wrote to the partition we keep its epoch and its last
`max_batches` batches (sequence range, offsets, timestamp). An incoming batch is
checked in Kafka's order, with the seeds' changes:

1. exact duplicate of a cached batch (same epoch, same first and last sequence) →
   NONE with the original offsets, nothing appended;
2. epoch older than the producer's → INVALID_PRODUCER_EPOCH;
3. same epoch, the whole batch within DUPLICATE_WINDOW sequences behind the last one
   (wrap-aware) but no longer cached → DUPLICATE_SEQUENCE_NUMBER, nothing appended
   (KAFKA-12207; clients count it as delivered with an unknown offset);
4. higher epoch: sequence must be 0; same epoch: last + 1, or 0 after 2^31-1 (the wrap
   real clients still use) → else OUT_OF_ORDER_SEQUENCE_NUMBER;
5. no state for the producer id: sequence 0 starts one; anything else →
   UNKNOWN_PRODUCER_ID, answered with the log start offset so the client can tell
   retention from data loss (the spurious-OutOfOrderSequence note).

State outlives the log data it came from (KIP-360): moving the log start offset never
drops a producer; only `producer.id.expiration.ms` of idleness does, and never while a
transaction is open. Snapshots keep every cached batch of every producer, so duplicate
detection after a restart is as good as before it (Kafka keeps only the last batch).
"""

from __future__ import annotations

import logging
import os
import struct
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import crc32c

from ..durable_file import replace_unsynced
from ..errors import ErrorCode
from ..records.batch import BatchHeader
from .checkpoints import atomic_write

log = logging.getLogger(__name__)

SEQUENCE_SPACE = 0x80000000  # sequences run 0 .. 2^31-1, then wrap to 0
DUPLICATE_WINDOW = 1000
SNAPSHOT_SUFFIX = ".snapshot"
# Kafka's producer snapshot is version 1 and holds one batch per producer. Version 2 is
# oncelog's: every cached batch, the broker-time of the last append, the last epoch.
SNAPSHOT_VERSION = 3
SNAPSHOTS_KEPT = 3


@dataclass(slots=True)
class CachedBatch:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    max_timestamp: int


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int = -1
    coordinator_epoch: int = -1
    last_timestamp: int = -1  # max record timestamp of the last batch (what DescribeProducers shows)
    last_append_ms: int = -1  # broker clock at the last append or marker: what expiry measures
    current_txn_first_offset: int = -1
    batches: deque[CachedBatch] = field(default_factory=deque)
    # The last sequence once the cached batches were dropped for idleness: enough for the producer to
    # continue where it stopped (sequence floor + 1) and for window duplicates to be recognised.
    floor_seq: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else self.floor_seq

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1


@dataclass(slots=True)
class ProducerCheck:
    """The verdict on one batch. `duplicate` is set when rule 1 answers with the original batch."""

    error: ErrorCode = ErrorCode.NONE
    message: str | None = None
    duplicate: CachedBatch | None = None

    @property
    def ok(self) -> bool:
        return self.error == ErrorCode.NONE and self.duplicate is None


_OK = ProducerCheck()


def _behind(last: int, seq: int) -> int:
    """How many sequences `seq` lies behind `last`, modulo the wrap."""
    return (last - seq) % SEQUENCE_SPACE


class ProducerStateManager:
    def __init__(self, directory: str | os.PathLike, name: str, max_batches: int = 5) -> None:
        self.directory = Path(directory)
        self.name = name
        self.max_batches = max_batches
        self.entries: dict[int, ProducerEntry] = {}
        # Producers with an open transaction here → its first offset; the last stable offset is their minimum.
        self.ongoing: dict[int, int] = {}
        # Counters for metrics: how each rule fired.
        self.stats = {"duplicates_cached": 0, "duplicates_window": 0, "unknown_producer": 0,
                      "out_of_order": 0, "fenced_epoch": 0}

    # -- the append rules -------------------------------------------------------------------------------
    def check(self, header: BatchHeader) -> ProducerCheck:
        """Decide on a client batch; changes nothing. Call `record` after the append succeeded."""
        pid = header.producer_id
        if pid < 0:
            return _OK
        entry = self.entries.get(pid)
        epoch = header.producer_epoch
        first = header.base_sequence
        last = header.last_sequence
        if entry is None:
            if first == 0:
                return _OK
            self.stats["unknown_producer"] += 1
            return ProducerCheck(
                ErrorCode.UNKNOWN_PRODUCER_ID,
                f"{self.name} has no state for producer {pid} and the batch starts at sequence {first}, not 0",
            )
        if epoch == entry.epoch:
            for cached in entry.batches:
                if cached.first_seq == first and cached.last_seq == last:
                    self.stats["duplicates_cached"] += 1
                    return ProducerCheck(duplicate=cached)
        if self.fenced(pid, epoch):
            self.stats["fenced_epoch"] += 1
            return ProducerCheck(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"Producer {pid} epoch {epoch} is older than the current epoch {entry.epoch} on {self.name}",
            )
        if epoch > entry.epoch:
            if first == 0:
                return _OK
            self.stats["out_of_order"] += 1
            return ProducerCheck(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"Producer {pid} moved to epoch {epoch} on {self.name}; its first batch must have sequence 0, "
                f"not {first}",
            )
        last_seq = entry.last_seq
        if last_seq >= 0:
            if first == (last_seq + 1) % SEQUENCE_SPACE:
                return _OK
            if _behind(last_seq, first) < DUPLICATE_WINDOW and _behind(last_seq, last) < DUPLICATE_WINDOW \
                    and _behind(last, first) < SEQUENCE_SPACE // 2:
                self.stats["duplicates_window"] += 1
                return ProducerCheck(
                    ErrorCode.DUPLICATE_SEQUENCE_NUMBER,
                    f"Sequences {first}..{last} of producer {pid} were already written to {self.name} "
                    f"(last sequence {last_seq})",
                )
        elif first == 0:
            return _OK
        self.stats["out_of_order"] += 1
        return ProducerCheck(
            ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
            f"Out of order sequence for producer {pid} at epoch {epoch} on {self.name}: expected "
            f"{(last_seq + 1) % SEQUENCE_SPACE}, got {first}",
        )

    def record(self, header: BatchHeader, base_offset: int, now_ms: int) -> None:
        """Account for a batch that is now in the log (a client append, or a replay at recovery)."""
        pid = header.producer_id
        if pid < 0:
            return
        entry = self.entries.get(pid)
        if entry is None:
            entry = self.entries[pid] = ProducerEntry(pid)
        if header.producer_epoch != entry.epoch:
            entry.epoch = header.producer_epoch
            entry.batches.clear()
            entry.floor_seq = -1
        last_offset = base_offset + header.last_offset_delta
        if header.base_sequence >= 0:
            entry.batches.append(CachedBatch(
                header.base_sequence, header.last_sequence, base_offset, last_offset, header.max_timestamp
            ))
            while len(entry.batches) > self.max_batches:
                entry.batches.popleft()
        entry.last_timestamp = header.max_timestamp
        entry.last_append_ms = now_ms
        if header.is_transactional and entry.current_txn_first_offset < 0:
            entry.current_txn_first_offset = base_offset
            self.ongoing[pid] = base_offset

    def check_marker(self, producer_id: int, epoch: int, coordinator_epoch: int) -> ProducerCheck:
        """A COMMIT/ABORT marker from the coordinator: fenced if older than the producer's epoch."""
        entry = self.entries.get(producer_id)
        if entry is None:
            return _OK
        if epoch < entry.epoch:
            return ProducerCheck(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"Marker epoch {epoch} is older than producer {producer_id}'s epoch {entry.epoch} on {self.name}",
            )
        if coordinator_epoch < entry.coordinator_epoch:
            return ProducerCheck(
                ErrorCode.TRANSACTION_COORDINATOR_FENCED,
                f"Marker coordinator epoch {coordinator_epoch} is older than {entry.coordinator_epoch}",
            )
        return _OK

    def record_marker(self, producer_id: int, epoch: int, coordinator_epoch: int, now_ms: int,
                      timestamp: int) -> int:
        """Close the producer's open transaction here; return its first offset (-1 if none was open).

        A marker with a higher epoch (a coordinator-side fence or timeout) starts the new epoch with no
        cached batches, so the producer's next batch at that epoch must start at sequence 0.
        """
        entry = self.entries.get(producer_id)
        if entry is None:
            entry = self.entries[producer_id] = ProducerEntry(producer_id)
        if epoch != entry.epoch:
            entry.epoch = epoch
            entry.batches.clear()
            entry.floor_seq = -1
        entry.coordinator_epoch = coordinator_epoch
        entry.last_timestamp = timestamp
        entry.last_append_ms = now_ms
        first = entry.current_txn_first_offset
        entry.current_txn_first_offset = -1
        self.ongoing.pop(producer_id, None)
        return first

    def open_transaction(self, producer_id: int) -> bool:
        return producer_id in self.ongoing

    def fenced(self, producer_id: int, epoch: int) -> bool:
        """Whether this partition refuses the producer's batches at `epoch` (rule 2: an epoch older than the one it
        knows), before any other question about the batch is asked."""
        entry = self.entries.get(producer_id)
        return entry is not None and epoch < entry.epoch

    def first_unstable_offset(self) -> int | None:
        return min(self.ongoing.values()) if self.ongoing else None

    # -- expiry -----------------------------------------------------------------------------------------
    def expire(self, now_ms: int, expiration_ms: int, forget_ms: int | None = None) -> list[int]:
        """Age out idle producers (never one with an open transaction); return the ids forgotten.

        After `expiration_ms` (producer.id.expiration.ms) of idleness a producer's cached batches go and
        only its epoch and last sequence stay, so a producer that comes back simply continues. After
        `forget_ms` (transactional.id.expiration.ms, the seed's choice in KIP-360; default: the same as
        `expiration_ms`) it is forgotten, and its next batch is answered UNKNOWN_PRODUCER_ID.
        """
        forget_ms = expiration_ms if forget_ms is None else max(forget_ms, expiration_ms)
        gone = []
        for pid, entry in list(self.entries.items()):
            if entry.current_txn_first_offset >= 0:
                continue
            idle = now_ms - entry.last_append_ms
            if idle >= forget_ms:
                del self.entries[pid]
                gone.append(pid)
            elif idle >= expiration_ms and entry.batches:
                entry.floor_seq = entry.batches[-1].last_seq
                entry.batches.clear()
                self.stats["cache_expired"] = self.stats.get("cache_expired", 0) + 1
        return gone

    # -- snapshots --------------------------------------------------------------------------------------
    def snapshot_path(self, offset: int) -> Path:
        return self.directory / f"{offset:020d}{SNAPSHOT_SUFFIX}"

    def list_snapshots(self) -> list[int]:
        offsets = []
        for entry in os.scandir(self.directory):
            if entry.name.endswith(SNAPSHOT_SUFFIX) and entry.name[:-len(SNAPSHOT_SUFFIX)].isdigit():
                offsets.append(int(entry.name[: -len(SNAPSHOT_SUFFIX)]))
        return sorted(offsets)

    def write_snapshot(self, offset: int, sync: bool = True) -> int | None:
        """Persist the state as of log offset `offset`. With `sync` the file is durable on return (the caller
        made the log durable up to `offset` first). Without, it is written but not synced, and its fd is returned
        for the caller to sync (a segment roll hands it to the log's next flush round): a snapshot a crash tears
        fails its CRC at load and an older one is used, and one above the recovered log end is dropped. So
        that an older, durable one is still there then, an unsynced write keeps one more snapshot."""
        data = encode_snapshot(self.entries.values())
        path = self.snapshot_path(offset)
        fd: int | None = None
        if sync:
            atomic_write(path, data)
        else:
            fd = replace_unsynced(path, data)
        for old in self.list_snapshots()[:-(SNAPSHOTS_KEPT if sync else SNAPSHOTS_KEPT + 1)]:
            try:
                self.snapshot_path(old).unlink()
            except OSError:
                pass
        return fd

    def load_latest_snapshot(self, max_offset: int) -> int | None:
        """Load the newest readable snapshot at or below `max_offset`; return its offset.

        Snapshots above `max_offset` describe data a crash took away; corrupt ones are
        skipped (and removed) in favour of an older one.
        """
        for offset in reversed(self.list_snapshots()):
            path = self.snapshot_path(offset)
            if offset > max_offset:
                log.info("%s: dropping snapshot %s above the log end %d", self.name, path.name, max_offset)
                path.unlink(missing_ok=True)
                continue
            try:
                entries = decode_snapshot(path.read_bytes(), self.max_batches)
            except (OSError, ValueError) as exc:
                log.warning("%s: snapshot %s unusable (%s); trying an older one", self.name, path.name, exc)
                path.unlink(missing_ok=True)
                continue
            self._set_entries(entries)
            return offset
        self._set_entries([])
        return None

    def _set_entries(self, entries: Iterable[ProducerEntry]) -> None:
        self.entries = {e.producer_id: e for e in entries}
        self.ongoing = {e.producer_id: e.current_txn_first_offset for e in self.entries.values()
                        if e.current_txn_first_offset >= 0}

    def delete_snapshots(self, above: int = -1) -> None:
        """Remove the snapshot files of offsets above `above` (all of them by default): state of log data
        that a truncation removed."""
        for offset in self.list_snapshots():
            if offset > above:
                self.snapshot_path(offset).unlink(missing_ok=True)

    # -- transfer to a new replica (seed 000) ---------------------------------------------------------------
    def export_state(self) -> bytes:
        """The whole state in the snapshot format (every cached batch, epochs, open transactions)."""
        return encode_snapshot(self.entries.values())

    def install_state(self, data: bytes) -> None:
        """Replace the state with an exported one; ValueError (nothing changed) if `data` is damaged."""
        self._set_entries(decode_snapshot(data, self.max_batches))


# -- snapshot format ----------------------------------------------------------------------------------------
# int16 version, uint32 crc32c of the rest, int32 count, then per producer:
#   int64 pid, int16 epoch, int32 coordinator epoch, int64 last timestamp, int64 last append ms,
#   int64 txn first offset, int32 floor sequence (v3), int32 batch count, then per batch:
#   int32 first seq, int32 last seq, int64 first offset, int64 last offset, int64 max timestamp
_HEAD = struct.Struct(">hI")
_COUNT = struct.Struct(">i")
_ENTRY = struct.Struct(">qhiqqqii")
_ENTRY_V2 = struct.Struct(">qhiqqqi")
_BATCH = struct.Struct(">iiqqq")


def encode_snapshot(entries: Iterable[ProducerEntry]) -> bytes:
    body = bytearray()
    items = list(entries)
    body += _COUNT.pack(len(items))
    for e in items:
        body += _ENTRY.pack(e.producer_id, e.epoch, e.coordinator_epoch, e.last_timestamp, e.last_append_ms,
                            e.current_txn_first_offset, e.floor_seq, len(e.batches))
        for b in e.batches:
            body += _BATCH.pack(b.first_seq, b.last_seq, b.first_offset, b.last_offset, b.max_timestamp)
    return _HEAD.pack(SNAPSHOT_VERSION, crc32c.crc32c(bytes(body))) + bytes(body)


def decode_snapshot(data: bytes, max_batches: int = 5) -> list[ProducerEntry]:
    """Parse a snapshot; ValueError on any damage (bad CRC, truncation, trailing bytes)."""
    if len(data) < _HEAD.size + _COUNT.size:
        raise ValueError("snapshot too short")
    version, crc = _HEAD.unpack_from(data, 0)
    if version not in (2, SNAPSHOT_VERSION):
        raise ValueError(f"unknown snapshot version {version}")
    body = memoryview(data)[_HEAD.size:]
    if crc32c.crc32c(body) != crc:
        raise ValueError("snapshot CRC mismatch")
    return list(_iter_entries(body, max_batches, version))


def _iter_entries(body: memoryview, max_batches: int, version: int = SNAPSHOT_VERSION) -> Iterator[ProducerEntry]:
    entry_struct = _ENTRY if version >= 3 else _ENTRY_V2
    try:
        (count,) = _COUNT.unpack_from(body, 0)
        pos = _COUNT.size
        if count < 0 or count * entry_struct.size > len(body):
            raise ValueError("impossible producer count")
        for _ in range(count):
            if version >= 3:
                pid, epoch, coord, last_ts, last_append, txn_first, floor, nbatches = entry_struct.unpack_from(
                    body, pos)
            else:
                pid, epoch, coord, last_ts, last_append, txn_first, nbatches = entry_struct.unpack_from(body, pos)
                floor = -1
            pos += entry_struct.size
            if nbatches < 0 or pos + nbatches * _BATCH.size > len(body):
                raise ValueError("impossible batch count")
            batches: deque[CachedBatch] = deque()
            for _ in range(nbatches):
                batches.append(CachedBatch(*_BATCH.unpack_from(body, pos)))
                pos += _BATCH.size
            while len(batches) > max_batches:
                batches.popleft()
            yield ProducerEntry(pid, epoch, coord, last_ts, last_append, txn_first, batches, floor)
        if pos != len(body):
            raise ValueError("trailing bytes in snapshot")
    except struct.error as exc:
        raise ValueError(f"truncated snapshot: {exc}") from None
