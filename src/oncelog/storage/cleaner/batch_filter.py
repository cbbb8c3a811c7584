"""The rules of a clean, one batch at a time (docs/log-cleaner.md §1).

Pure: a batch's bytes and what the round knows (the offset map, the time, the producers' last batches, the
transactions it walks through) in, the bytes to write out. The segment cleaner feeds it every batch of the
segments it rewrites, in offset order, with one `TransactionTracker` for the whole walk.

Kafka's `Cleaner` decides the same things; where it writes a batch back:
- a batch whose records all stay, with no delete horizon to set, is written as it was (its bytes, unparsed
  beyond the walk);
- a batch that loses some records keeps its base offset, its *last offset* (so a producer's last sequence, base
  sequence + last offset delta, survives: Kafka's `overrideLastOffset`), producer id, epoch, base sequence,
  leader epoch, codec and flags; the records that stay are byte-identical apart from their timestamp delta when
  a delete horizon moves the base timestamp (KIP-534);
- the last batch of a producer stays even when all its records go, as an empty batch (header only), so a replica
  rebuilding producer state from the cleaned log still knows the producer's epoch and last sequence (seed 000).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ...records.batch import (
    COMPRESSION_MASK,
    DELETE_HORIZON_MASK,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MIN_BATCH_LENGTH,
    BatchHeader,
    pack_header,
    read_header,
    rewrite_crc,
)
from ...records.compression import compress, decompress
from ...records.control import ControlRecordError, ControlType, parse_control_key
from ...records.raw_records import RawRecord, encode, walk
from ..txn_index import AbortedTxn
from .offset_map import OffsetMap


class TransactionTracker:
    """Which transaction each batch of the walk belongs to, and when a marker may go (Kafka's
    CleanedTransactionMetadata).

    Built with the aborted transactions (from the transaction index) whose data may lie in the walked range. A
    data batch of an aborted transaction is dropped. An ABORT marker may go once a walk met none of its
    transaction's data (a first clean drops the data and keeps the marker; a later one may drop the marker), and
    while it stays its entry goes into the cleaned segment's transaction index (`index`). A COMMIT marker may go
    once a walk met none of its transaction's data. "May go" still waits for the marker's delete horizon.
    """

    def __init__(self, aborted: Iterable[AbortedTxn]) -> None:
        self._pending = deque(sorted(aborted, key=lambda t: t.first_offset))
        self._aborted: dict[int, tuple[AbortedTxn, bool]] = {}  # producer id -> (txn, a batch of it was met)
        self._committed: set[int] = set()  # producers with an open, not aborted transaction met in this walk
        self.index: list[AbortedTxn] = []

    def _start_up_to(self, offset: int) -> None:
        while self._pending and self._pending[0].first_offset <= offset:
            txn = self._pending.popleft()
            self._aborted[txn.producer_id] = (txn, False)

    def data_batch(self, header: BatchHeader) -> bool:
        """True if the batch is data of an aborted transaction (to be dropped)."""
        self._start_up_to(header.last_offset)
        if not header.is_transactional:
            return False
        ongoing = self._aborted.get(header.producer_id)
        if ongoing is not None:
            self._aborted[header.producer_id] = (ongoing[0], True)
            return True
        self._committed.add(header.producer_id)
        return False

    def control_batch(self, header: BatchHeader, control_type: int | None) -> bool:
        """True if the marker's transaction has no data left in the walk (the marker may go at its horizon).
        `control_type` None: an empty control batch (a marker already emptied by an earlier clean)."""
        self._start_up_to(header.last_offset)
        if control_type is None:
            return True
        pid = header.producer_id
        if control_type == ControlType.ABORT:
            ongoing = self._aborted.pop(pid, None)
            if ongoing is not None and ongoing[1]:
                self.index.append(ongoing[0])
                return False
            return True
        if control_type == ControlType.COMMIT:
            if pid in self._committed:
                self._committed.discard(pid)
                return False
            return True
        return False


@dataclass(frozen=True, slots=True)
class CleanRules:
    """What one round of cleaning knows, the same for every batch it rewrites."""

    offset_map: OffsetMap
    now_ms: int
    delete_retention_ms: int
    # producer id -> last offset of that producer's newest batch in the whole log: that batch always stays.
    last_batch_of_producer: Mapping[int, int]
    # producer id -> epoch, for producers whose newest entry is a marker that bumped the epoch (no data batch of
    # that epoch): their markers of that epoch stay, so a replica that replays the cleaned log still fences the
    # older epoch.
    marker_epoch_of_producer: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Filtered:
    """One source batch after the rules: `data` to write (the source view itself when unchanged), or None."""

    data: bytes | bytearray | memoryview | None
    records_kept: int
    records_removed: int


def records_section(batch: memoryview, header: BatchHeader) -> memoryview:
    """The uncompressed records of a whole batch."""
    body = batch[HEADER_SIZE:header.size]
    codec = header.attributes & COMPRESSION_MASK
    return memoryview(decompress(codec, body)) if codec else body


def add_to_map(offset_map: OffsetMap, batch: memoryview, header: BatchHeader, aborted: bool) -> bool:
    """Put the keys of one data batch into the map; False (nothing put) when the batch does not fit, which
    ends the round before it. Control batches and aborted data add nothing (Kafka's buildOffsetMap)."""
    if header.is_control or aborted or header.record_count == 0:
        return True
    if not offset_map.has_room_for(header.record_count):
        return False
    base = header.base_offset
    for record in walk(records_section(batch, header), header.record_count):
        if record.key is not None:
            offset_map.put(record.key, base + record.offset_delta)
    return True


def control_type(batch: memoryview, header: BatchHeader) -> int | None:
    """The control type of a control batch (ControlType), None for an empty one (a marker an earlier clean
    emptied), -1 for a key this broker does not know (such a batch is kept as it is)."""
    return _control_type(list(walk(records_section(batch, header), header.record_count)))


def _control_type(records: list[RawRecord]) -> int | None:
    if not records:
        return None
    if records[0].key is None:
        return -1
    try:
        return parse_control_key(records[0].key)
    except ControlRecordError:
        return -1


def filter_batch(batch: memoryview, rules: CleanRules, tracker: TransactionTracker) -> Filtered:
    """Apply the rules to one whole batch (`batch` holds exactly it). RawRecordError, CompressionError or
    ControlRecordError for a batch that does not parse: the caller marks the partition uncleanable."""
    header = read_header(batch)
    count = header.record_count
    last_of_producer = (header.producer_id >= 0
                        and rules.last_batch_of_producer.get(header.producer_id) == header.last_offset)
    horizon = header.base_timestamp if header.attributes & DELETE_HORIZON_MASK else None
    if header.is_control:
        records = list(walk(records_section(batch, header), count))
        if not tracker.control_batch(header, _control_type(records)):
            return Filtered(batch, count, 0)
        if horizon is None and records:
            new_horizon = rules.now_ms + rules.delete_retention_ms
            return Filtered(_rebuild(batch, header, records, new_horizon), count, 0)
        if horizon is not None and horizon > rules.now_ms:
            return Filtered(batch, count, 0)
        if rules.marker_epoch_of_producer.get(header.producer_id) == header.producer_epoch:
            # The marker that set its producer's epoch stays whole (Kafka keeps it as an empty batch, which a
            # replay skips): a replica that rebuilds producer state from this log still fences older epochs.
            return Filtered(batch, count, 0)
        return Filtered(None, 0, count)

    if tracker.data_batch(header):
        return Filtered(_empty(header) if last_of_producer else None, 0, count)
    kept: list[RawRecord] = []
    tombstone_kept = False
    retain_deletes = horizon is None or horizon > rules.now_ms
    base = header.base_offset
    for record in walk(records_section(batch, header), count):
        if record.key is None:
            continue  # a compacted log keeps only keyed records (Kafka drops the others)
        newest = rules.offset_map.get(record.key)
        if newest is not None and base + record.offset_delta < newest:
            continue
        if record.value_is_null:
            if not retain_deletes:
                continue
            tombstone_kept = True
        kept.append(record)
    removed = count - len(kept)
    if not kept:
        return Filtered(_empty(header) if last_of_producer else None, 0, removed)
    set_horizon = tombstone_kept and horizon is None
    if not removed and not set_horizon:
        return Filtered(batch, count, 0)
    new_horizon = rules.now_ms + rules.delete_retention_ms if set_horizon else horizon
    return Filtered(_rebuild(batch, header, kept, new_horizon), len(kept), removed)


def _rebuild(batch: memoryview, header: BatchHeader, records: list[RawRecord], horizon: int | None) -> bytearray:
    """The batch with only `records`, its last offset kept, and `horizon` (if any) as its delete horizon: the
    base timestamp becomes the horizon (KIP-534) and every record's timestamp delta moves with it."""
    base_timestamp = header.base_timestamp if horizon is None else horizon
    shift = header.base_timestamp - base_timestamp
    body: bytes = b"".join(encode(r, r.timestamp_delta + shift) for r in records)
    codec = header.attributes & COMPRESSION_MASK
    if codec:
        body = compress(codec, body)
    if header.log_append_time:
        max_timestamp = header.max_timestamp
    else:
        max_timestamp = max(header.base_timestamp + r.timestamp_delta for r in records)
    attributes = header.attributes | (DELETE_HORIZON_MASK if horizon is not None else 0)
    out = bytearray(HEADER_SIZE)
    out += body
    pack_header(out, 0, header._replace(length=len(out) - LOG_OVERHEAD, crc=0, attributes=attributes,
                                        base_timestamp=base_timestamp, max_timestamp=max_timestamp,
                                        record_count=len(records)))
    rewrite_crc(out, 0, len(out))
    return out


def _empty(header: BatchHeader) -> bytearray:
    """A producer's last batch with every record gone: its header alone (offsets, producer id, epoch, base
    sequence and the flags kept; no codec, no records), so its epoch and last sequence stay in the log."""
    out = bytearray(HEADER_SIZE)
    attributes = header.attributes & ~COMPRESSION_MASK & ~DELETE_HORIZON_MASK
    pack_header(out, 0, header._replace(length=MIN_BATCH_LENGTH, crc=0, attributes=attributes,
                                        base_timestamp=header.max_timestamp, record_count=0))
    rewrite_crc(out, 0, len(out))
    return out
