"""A partition: its log plus the state derived from it (producer state).

This is the narrow interface the broker's handlers (and, later, the transaction
coordinator) use: `append_records` checks and appends in one synchronous step on the
event loop, so no other append can slip between the producer-state verdict and the
write. Producer state is snapshotted whenever data it was built from could go away
(segment roll, segment deletion, clean shutdown). Before a deletion and at shutdown the
log is made durable up to the snapshot's offset first; at a roll (inside an append, on
the loop) the snapshot is written at once and synced by the log's next flush round, and
a snapshot a crash left ahead of the recovered log, or torn, is dropped at load.

For replication a partition also keeps its leader-epoch cache, and offers what a
follower does to its storage: truncate (rebuilding producer state and the aborted-
transaction index for what remains), start over at another offset, follow the leader's
log start offset, and take over a leader's producer state (seed 000). A log that started
over holds the marker file `producer-state-incomplete` until it has taken over a leader's
producer state, so a restart in between still knows its producers are not all there.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..errors import ErrorCode, KafkaError
from ..records.batch import BatchHeader, read_header, set_leader_epoch
from ..records.control import ControlRecordError, build_marker, parse_marker
from ..records.reader import Batch, iter_batches, read_batches
from .checkpoints import CorruptCheckpointError, atomic_write, fsync_dir
from .cleaner.manager import CleanerView
from .cleaner.segment_cleaner import CleanedGroup, SourceSegment
from .leader_epochs import LeaderEpochCache
from .partition_log import PartitionLog
from .producer_state import ProducerStateManager
from .segment_swap import SwapGroup
from .txn_index import AbortedTxn, TxnIndex

log = logging.getLogger(__name__)

# Present while this replica's producer state lacks what its leader knows: its log started over (a new replica, a
# lost disk, a follower left behind the leader's log start) and no leader's state was installed since.
PRODUCER_STATE_INCOMPLETE_FILE = "producer-state-incomplete"


@dataclass(slots=True)
class AppendResult:
    error: ErrorCode = ErrorCode.NONE
    message: str | None = None
    base_offset: int = -1
    last_offset: int = -1
    log_append_time: int = -1
    duplicate: bool = False


class Partition:
    def __init__(self, plog: PartitionLog, max_producer_batches: int = 5) -> None:
        self.log = plog
        self.topic = plog.topic
        self.index = plog.partition
        self.producers = ProducerStateManager(plog.directory, plog.name, max_producer_batches)
        self.txn_index = TxnIndex(plog.directory, plog.name)
        self.leader_epochs = self._load_leader_epochs()
        # The leader epoch this replica leads at, stamped into every batch it appends as leader (Kafka's
        # partitionLeaderEpoch), so followers and consumers learn which epoch wrote what. Set by the replica
        # manager when it becomes leader; -1 (the single node): batches are appended as the client built them.
        self.leader_epoch = -1
        # Set by the broker when a transaction coordinator runs: decides whether a transactional batch
        # belongs to its producer's ongoing transaction (KIP-890 part 1, a local call here).
        self.verify_transaction: Callable[[str | None, int, int, str, int], tuple[ErrorCode, str | None]] | None = None
        plog.on_roll = self._on_roll
        plog.before_delete = self._before_delete
        plog.on_segment_deleted = self._on_segment_deleted

    @property
    def name(self) -> str:
        return self.log.name

    @property
    def last_stable_offset(self) -> int:
        """Below it every transaction is decided: the end of what read_committed consumers may see."""
        hwm = self.log.high_watermark
        first_open = self.producers.first_unstable_offset()
        return hwm if first_open is None else min(first_open, hwm)

    def aborted_transactions(self, start: int, end: int) -> list[tuple[int, int]]:
        return self.txn_index.collect(start, end)

    def _load_leader_epochs(self) -> LeaderEpochCache:
        """The checkpointed cache, cut to the log as it was recovered (a crash may have taken a tail the file
        still names); rebuilt from the batches' leader epochs if the file is unreadable."""
        plog = self.log
        try:
            cache = LeaderEpochCache(plog.directory, plog.name)
        except CorruptCheckpointError as exc:
            log.error("%s: %s; rebuilding the leader epochs from the log", self.name, exc)
            cache = LeaderEpochCache(plog.directory, plog.name, load=False)
            cache.rebuild((h.leader_epoch, h.base_offset) for h in plog.iter_batches())
        cache.truncate_from_end(plog.log_end_offset)
        cache.truncate_from_start(plog.log_start_offset)
        return cache

    # -- recovery ---------------------------------------------------------------------------------------
    def load_producer_state(self, now_ms: int) -> None:
        """Newest snapshot at or below the log end, then replay the batches after it.

        The state is whole only if the log holds every batch from that snapshot (from offset 0 without one) to
        its end. When it does not, the log holds less than this replica once had: its partition directory was
        lost or emptied while the checkpoints kept its log start, or a recovery cut it below every snapshot
        left. Then the producers whose batches were in the gap are missing, and the log is marked
        `producer_state_incomplete` (durably, before anything else is written), as a start-over marks it, so a
        follower takes its leader's state before it may join the ISR (seed 000, docs/cluster.md §4.7)."""
        plog = self.log
        self.txn_index.load()
        start = self.producers.load_latest_snapshot(plog.log_end_offset)
        first_base = plog.segments[0].base_offset if plog.segments else 0
        replay_from = first_base if start is None else max(start, first_base)
        if (0 if start is None else start) < first_base:
            if not self.producer_state_incomplete:
                atomic_write(self._incomplete_path, str(first_base).encode())
            log.warning(
                "%s: the log starts at %d but the producer state %s: producers whose only batches were "
                "below %d are missing here (marked incomplete; a follower takes its leader's state)",
                self.name, first_base,
                "has no snapshot" if start is None else f"snapshot is of offset {start}", first_base,
            )
        self.txn_index.truncate_from(replay_from, [seg.base_offset for seg in plog.segments])
        replayed = 0
        for header in plog.iter_batches(replay_from, plog.log_end_offset):
            if header.base_offset < replay_from:
                continue
            if header.is_control:
                self._replay_marker(header, now_ms)
            else:
                self.producers.record(header, header.base_offset, now_ms)
            replayed += 1
        if replayed or (start != plog.log_end_offset and not (start is None and plog.log_end_offset == 0)):
            # (Not for a log that never held anything, a new partition: there is no state to keep, and writing
            # an empty snapshot cost a third of a topic creation's time, two fsyncs per partition.)
            self.snapshot()
        log.debug("%s: producer state of %d producers (snapshot %s, %d batches replayed)",
                  self.name, len(self.producers.entries), start, replayed)

    def _replay_marker(self, header: BatchHeader, now_ms: int) -> None:
        batch = self._read_batch_bytes(header.base_offset)
        if batch is None:
            return
        try:
            marker = parse_marker(batch)
        except ControlRecordError:
            return  # another kind of control batch: nothing for producer state
        self._apply_marker(marker.producer_id, marker.producer_epoch, marker.commit, marker.coordinator_epoch,
                           header.base_offset, now_ms, marker.timestamp)

    # -- appends ----------------------------------------------------------------------------------------
    def append_records(self, buf, header: BatchHeader, now_ms: int, log_append_time: bool,
                       transactional_id: str | None = None) -> AppendResult:
        """Check a validated client batch against producer state and append it, atomically."""
        if self.log.offline_reason is not None:
            # Before the duplicate check: a cached batch of an offline log may be one whose fsync failed and
            # that was cut off, so even an acks=1 retry must not be answered with its offset.
            return AppendResult(ErrorCode.KAFKA_STORAGE_ERROR, f"Log {self.name} is offline: {self.log.offline_reason}")
        check = self.producers.check(header)
        if check.ok and header.producer_id >= 0:
            open_txn = self.producers.open_transaction(header.producer_id)
            if header.is_transactional and not open_txn:
                # First batch of a transaction here: the coordinator must have this partition in it,
                # or a zombie could start a transaction nobody will ever end (seed 000, point 3).
                if self.verify_transaction is None:
                    return AppendResult(ErrorCode.INVALID_TXN_STATE, "No transaction coordinator is running")
                code, message = self.verify_transaction(
                    transactional_id, header.producer_id, header.producer_epoch, self.topic, self.index
                )
                if code:
                    return AppendResult(code, message)
            elif not header.is_transactional and open_txn:
                return AppendResult(
                    ErrorCode.INVALID_TXN_STATE,
                    f"Producer {header.producer_id} sent a non-transactional batch to {self.name} "
                    "while its transaction there is open",
                )
        if check.duplicate is not None:
            cached = check.duplicate
            return AppendResult(
                base_offset=cached.first_offset, last_offset=cached.last_offset,
                log_append_time=cached.max_timestamp if log_append_time else -1, duplicate=True,
            )
        if check.error:
            return AppendResult(check.error, check.message)
        if self.leader_epoch >= 0:
            set_leader_epoch(buf, 0, self.leader_epoch)  # not covered by the CRC
        try:
            base = self.log.append(buf, header)
        except KafkaError as exc:
            return AppendResult(exc.code, exc.message)
        self.producers.record(header, base, now_ms)
        return AppendResult(
            base_offset=base, last_offset=base + header.last_offset_delta,
            log_append_time=header.max_timestamp if log_append_time else -1,
        )

    def append_marker(self, producer_id: int, epoch: int, commit: bool, coordinator_epoch: int,
                      now_ms: int) -> AppendResult:
        """Write a COMMIT/ABORT marker for `producer_id` (the coordinator's call, or an admin abort)."""
        check = self.producers.check_marker(producer_id, epoch, coordinator_epoch)
        if check.error:
            return AppendResult(check.error, check.message)
        buf = build_marker(producer_id, epoch, commit, coordinator_epoch, now_ms,
                           partition_leader_epoch=self.leader_epoch)
        header = read_header(buf)
        try:
            offset = self.log.append(buf, header)
        except KafkaError as exc:
            return AppendResult(exc.code, exc.message)
        self._apply_marker(producer_id, epoch, commit, coordinator_epoch, offset, now_ms, now_ms)
        return AppendResult(base_offset=offset, last_offset=offset)

    def append_replicated(self, buf, header: BatchHeader, now_ms: int) -> None:
        """A follower appends one of its leader's batches as it is: offsets already assigned (its base offset
        must be this log's end), producer state and the transaction index fed exactly as recovery replays a
        log (every data batch recorded with its sequences, the cache of the last batches included, so a new
        leader answers retries as the old one would; every marker closes its transaction), and a batch of a
        newer leader epoch starts that epoch in the leader-epoch cache. `buf` is exactly the batch, writable;
        its CRC is the caller's to check. A batch may start past the log end: where the leader's cleaner
        removed batches, the copy keeps the same gap (offsets never change). KafkaError: OFFSET_OUT_OF_RANGE
        for a batch that starts below the log end, or what the log's append raises."""
        end = self.log.log_end_offset
        if header.base_offset < end:
            raise KafkaError(ErrorCode.OFFSET_OUT_OF_RANGE,
                             f"{self.name}: replicated batch at {header.base_offset} starts below the "
                             f"log end {end}")
        base = self.log.append(buf, header, at_offset=header.base_offset)
        epoch = header.leader_epoch
        if epoch > self.leader_epochs.latest_epoch:
            self.leader_epochs.assign(epoch, base)
        if not header.is_control:
            self.producers.record(header, base, now_ms)
            return
        try:
            marker = parse_marker(buf)
        except ControlRecordError:
            return  # another kind of control batch: nothing for producer state
        self._apply_marker(marker.producer_id, marker.producer_epoch, marker.commit, marker.coordinator_epoch,
                           base, now_ms, marker.timestamp)

    def _apply_marker(self, producer_id: int, epoch: int, commit: bool, coordinator_epoch: int, offset: int,
                      now_ms: int, timestamp: int) -> None:
        first = self.producers.record_marker(producer_id, epoch, coordinator_epoch, now_ms, timestamp)
        if not commit and first >= 0:
            segment_base = self.log.segments[-1].base_offset if self.log.segments else 0
            for seg in reversed(self.log.segments):
                if seg.base_offset <= offset:
                    segment_base = seg.base_offset
                    break
            lso = self.producers.first_unstable_offset()
            self.txn_index.append(AbortedTxn(offset, producer_id, first, offset if lso is None else lso),
                                  segment_base)

    # -- replication: a follower's storage operations ----------------------------------------------------
    def truncate_to(self, offset: int, now_ms: int) -> int:
        """Cut the log at `offset` (whole batches: see `PartitionLog.truncate_to`) and rebuild what derives from
        it: producer state from the newest snapshot at or below the new end plus a replay (snapshots above it
        are dropped), the aborted-transaction index likewise, and the leader epochs that start at or after the
        new end. A cut below the first segment starts the log over there: the producer state is then marked
        incomplete, as by `truncate_fully_and_start_at`. Returns the new log end offset. The caller
        checkpoints (`LogManager.truncate_to`)."""
        before = self.log.log_end_offset
        segments = self.log.segments
        if offset < before and segments and offset < segments[0].base_offset:
            atomic_write(self._incomplete_path, str(offset).encode())
        end = self.log.truncate_to(offset)
        self.leader_epochs.truncate_from_end(end)  # also without a cut: an epoch assigned at the old end
        if end < before:
            self.load_producer_state(now_ms)
        return end

    def truncate_fully_and_start_at(self, offset: int, now_ms: int) -> None:
        """Empty the log and start it at `offset`, with no producer state, no aborted transactions and no
        leader epochs (`install_producer_state` gives it a leader's producers). The producer state is marked
        incomplete first, durably (`producer_state_incomplete`), so a crash before the install cannot pass
        for a replica that has it all. OSError if the mark cannot be written (nothing was truncated)."""
        atomic_write(self._incomplete_path, str(offset).encode())
        self.log.truncate_fully_and_start_at(offset)
        self.producers.delete_snapshots()
        self.leader_epochs.clear()
        self.load_producer_state(now_ms)

    def advance_log_start(self, offset: int) -> int:
        """Follow the leader's log start offset (never backwards; see `PartitionLog.advance_log_start`); the
        leader epochs before it go. Returns the log start offset. Producer state stays (KIP-360)."""
        start = self.log.advance_log_start(offset)
        self.leader_epochs.truncate_from_start(start)
        return start

    def export_producer_state(self) -> tuple[bytes, int]:
        """(the producer state in the snapshot format, the log end offset it describes): what a replica
        added by reassignment installs before it may join the ISR (seed 000)."""
        return self.producers.export_state(), self.log.log_end_offset

    def install_producer_state(self, snapshot: bytes, offset: int) -> None:
        """Take over a leader's producer state, exported when its log ended at `offset`, so this replica answers
        an exact retry with the original offsets and a window retry with DUPLICATE_SEQUENCE_NUMBER, also for
        producers whose batches it never had (before the log start, or before it joined).

        This log must end exactly at `offset`: emptied and started there (`truncate_fully_and_start_at`), or
        replicated up to exactly there. Installing state of a later offset and then replaying the batches in
        between would count them twice (a marker would close the wrong transaction); ValueError otherwise, and
        for damaged bytes. The state is snapshotted (the log synced first) and the incomplete mark of
        `truncate_fully_and_start_at` removed before returning, so a restart keeps it; KafkaError or OSError if
        that fails."""
        if offset != self.log.log_end_offset:
            raise ValueError(f"{self.name}: producer state of offset {offset} cannot be installed on a log that "
                             f"ends at {self.log.log_end_offset}")
        self.producers.install_state(snapshot)
        self.producers.delete_snapshots(above=offset)
        self.log.sync_now()
        self.txn_index.sync()
        self.producers.write_snapshot(offset)
        if self.producer_state_incomplete:
            os.unlink(self._incomplete_path)
            fsync_dir(self.log.directory)

    @property
    def producer_state_incomplete(self) -> bool:
        """True from a `truncate_fully_and_start_at` until the next `install_producer_state`, across restarts:
        producers whose batches all lie before this log's start are missing here (docs/cluster.md §4.7)."""
        return os.path.exists(self._incomplete_path)

    @property
    def _incomplete_path(self) -> str:
        return os.path.join(self.log.directory, PRODUCER_STATE_INCOMPLETE_FILE)

    # -- the log cleaner (storage/cleaner/manager.py CleanableLog) --------------------------------------------
    def cleaner_view(self, now_ms: int) -> CleanerView | None:
        """What a round of cleaning needs of this partition now; None when it is not compacted or is offline.

        The first uncleanable offset is the lowest of the active segment's base, the last stable offset (so an
        open transaction and what follows it stay as they are), the high watermark (so a follower never rewrites
        what its leader could still cut) and the first segment with a record younger than min.compaction.lag.ms.
        Every producer's newest batch is named, so it stays in the cleaned log (seed 000)."""
        plog = self.log
        config = plog.config
        if "compact" not in config["cleanup.policy"] or plog.offline_reason is not None:
            return None
        closed = plog.closed_segments()
        if not closed:
            return None
        uncleanable = min(plog.segments[-1].base_offset, self.last_stable_offset, plog.high_watermark)
        lag = config["min.compaction.lag.ms"]
        if lag > 0:
            young = next((s.base_offset for s in closed if s.largest_timestamp > now_ms - lag), None)
            if young is not None:
                uncleanable = min(uncleanable, young)
        first = closed[0].base_offset
        return CleanerView(
            key=(self.topic, self.index), directory=plog.directory, generation=plog.generation,
            log_start=plog.log_start_offset,
            segments=tuple(SourceSegment(*s) for s in closed), first_uncleanable=uncleanable,
            aborted=tuple(t for t in self.txn_index.entries if t.last_offset >= first),
            last_batch_of_producer={pid: e.last_offset for pid, e in self.producers.entries.items()
                                    if e.last_offset >= 0},
            marker_epoch_of_producer={pid: e.epoch for pid, e in self.producers.entries.items()
                                      if e.last_offset < 0 and e.epoch >= 0},
            delete_retention_ms=config["delete.retention.ms"],
            min_cleanable_ratio=config["min.cleanable.dirty.ratio"],
            max_compaction_lag_ms=config["max.compaction.lag.ms"], segment_bytes=config["segment.bytes"],
            max_index_bytes=config["segment.index.bytes"], index_interval_bytes=config["index.interval.bytes"])

    def replace_cleaned(self, groups: list[CleanedGroup], generation: int, last: bool) -> int | None:
        """Swap cleaned groups of a round in (`PartitionLog.replace_segments`), then take the cleaned segments'
        transaction indexes; the log's new generation, or None when the log changed meanwhile.
        Producer state does not change: offsets stay, and its snapshots keep describing them."""
        try:
            self.txn_index.sync()  # nothing of the old files may be left to write once they are replaced
        except OSError as exc:
            log.error("%s: cleaned segments not swapped in: %s", self.name, exc)
            return None
        new_generation = self.log.replace_segments(
            [(g.source_bases, SwapGroup(g.base_offset, g.next_offset)) for g in groups], generation, last=last)
        if new_generation is not None:
            self.txn_index.load()
        return new_generation

    # -- lookups by time -------------------------------------------------------------------------------
    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """ListOffsets by time: the first record at or after `timestamp`, as Kafka answers it.

        The log finds the batch through the time index; only that one batch is decoded.
        """
        found = self.log.offset_for_timestamp(timestamp)
        if found is None:
            return None
        batch = self._decode_batch_at(found[0])
        if batch is None or batch.header.log_append_time:
            return found
        start = self.log.log_start_offset
        for record in batch.records:
            if record.offset >= start and record.timestamp >= timestamp:
                return record.offset, record.timestamp
        return found

    def max_timestamp(self) -> tuple[int, int] | None:
        """ListOffsets MAX_TIMESTAMP: the first record carrying the largest timestamp (KIP-734)."""
        found = self.log.max_timestamp()
        if found is None:
            return None
        batch = self._decode_batch_at(found[0])
        if batch is None or batch.header.log_append_time:
            return found
        for record in batch.records:
            if record.timestamp == batch.header.max_timestamp:
                return record.offset, record.timestamp
        return found

    def iter_decoded_batches(self, start: int | None = None, chunk: int = 4 << 20) -> Iterator[Batch]:
        """Every batch from `start` (default: the log start) to the log end, records decoded.

        For the coordinators' state loading at startup, where every record matters.
        """
        plog = self.log
        offset = plog.log_start_offset if start is None else start
        end = plog.log_end_offset
        while offset < end:
            result = plog.read(offset, chunk, end, min_one_batch=True)
            try:
                if result.size == 0:
                    return
                data = result.data if result.data is not None else os.pread(result.fd, result.length,
                                                                            result.position)
            finally:
                result.close()
            progressed = False
            for batch in iter_batches(data):
                if batch.header.next_offset <= offset:
                    continue
                yield batch
                offset = batch.header.next_offset
                progressed = True
            if not progressed:
                return

    def _read_batch_bytes(self, offset: int) -> bytes | None:
        """The whole batch containing `offset` (durable or not)."""
        plog = self.log
        try:
            result = plog.read(offset, 1, plog.log_end_offset, min_one_batch=True)
        except KafkaError:
            return None
        try:
            return result.data if result.data is not None else os.pread(result.fd, result.length, result.position)
        finally:
            result.close()

    def _decode_batch_at(self, offset: int) -> Batch | None:
        if offset >= self.log.high_watermark:
            return None
        data = self._read_batch_bytes(offset)
        if data is None:
            return None
        try:
            batches = read_batches(data)
        except Exception:  # a damaged batch answers at batch granularity rather than failing the request
            return None
        return batches[0] if batches else None

    # -- snapshots --------------------------------------------------------------------------------------
    def snapshot(self) -> None:
        """Make the log durable to its end, then write the producer state as of that offset."""
        try:
            self.log.sync_now()
            self.txn_index.sync()
            self.producers.write_snapshot(self.log.log_end_offset)
        except (KafkaError, OSError) as exc:
            log.error("%s: producer-state snapshot failed: %s", self.name, exc)

    def _on_roll(self, new_base: int) -> None:
        """A roll happens inside an append, on the event loop: the snapshot is written there, but its fsyncs (and
        the transaction index's) go into the log's next flush round, as Kafka moved a roll's flushes to its
        scheduler (KAFKA-15046). Until that round a crash may take the snapshot back or leave it ahead of the
        log: a torn one fails its CRC and one above the recovered log end is dropped (load_latest_snapshot), so
        recovery starts from an older one and replays."""
        try:
            fds = self.txn_index.take_unsynced_fds()
            try:
                fd = self.producers.write_snapshot(self.log.log_end_offset, sync=False)
            except OSError:
                for held in fds:
                    os.close(held)
                raise
            if fd is not None:
                fds.append(fd)
            self.log.sync_in_next_round(fds)
        except (KafkaError, OSError) as exc:
            log.error("%s: producer-state snapshot at roll failed: %s", self.name, exc)

    def _before_delete(self) -> None:
        self.snapshot()

    def _on_segment_deleted(self, base: int) -> None:
        segments = self.log.segments
        next_base = segments[0].base_offset if segments else self.log.log_end_offset
        self.txn_index.drop_segment(base, next_base)
        if len(self.leader_epochs):
            self.leader_epochs.truncate_from_start(next_base)

    def expire_producers(self, now_ms: int, expiration_ms: int, forget_ms: int | None = None) -> list[int]:
        return self.producers.expire(now_ms, expiration_ms, forget_ms)

    def close(self) -> None:
        if not self.log.offline:
            self.snapshot()
        self.log.close()

    def delete(self) -> None:
        self.log.delete()
