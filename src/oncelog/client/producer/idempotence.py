"""Producer id, epoch and per-partition sequences: the seeds' client rules (DESIGN §4), without any I/O.

The rules, and why:

- A batch's (producer id, epoch, base sequence) is fixed when it is first sent and every retry sends the same
  bytes (KIP-360): the broker can only recognise a retry as a duplicate if it is byte-for-byte the same batch.
- Retries go out in sequence order, and only when nothing of the partition is in flight (`Partition.retry_ready`):
  a batch behind a failed one is answered OUT_OF_ORDER_SEQUENCE_NUMBER or UNKNOWN_PRODUCER_ID only because its
  predecessor is missing (`is_head` tells the two apart), so it is retried, not failed.
- More than 5 requests in flight are allowed (KAFKA-12207): the broker remembers the last 5 batches exactly and
  answers older retries within 1000 sequences with DUPLICATE_SEQUENCE_NUMBER, which is a success with an unknown
  offset. So the unacknowledged sequences of a partition, beyond its 5 newest batches, are kept inside that
  window (`Partition.may_send`); a retry can then never be mistaken for a gap.
- A fatal error fails every later batch of the partition that already has a sequence (KIP-360) — they cannot be
  written without the failed one — and the partition moves to a new epoch before new batches go out.
- The sequence never wraps (KAFKA-12207): a batch that would pass 2^31-1 waits for an epoch bump instead.
- A partition moves to a new epoch only when none of its batches of the old epoch is unresolved, so a retry of an
  old-epoch batch can never meet a newer epoch on the broker (INVALID_PRODUCER_EPOCH).
"""

from __future__ import annotations

import struct
from collections import deque
from typing import NamedTuple

from oncelog.records.batch import OFF_PRODUCER_ID, rewrite_crc

from .accumulator import ProducerBatch

MAX_SEQUENCE = 2**31 - 1
MAX_EPOCH = 32767  # an epoch the coordinator never hands out; reaching it means a new producer id
CACHED_BATCHES = 5  # batches the broker keeps per producer and partition, for exact duplicate answers
DUPLICATE_WINDOW = 1000  # sequences behind the last one that the broker answers DUPLICATE_SEQUENCE_NUMBER

_IDENTITY = struct.Struct(">qhi")


class Identity(NamedTuple):
    producer_id: int
    epoch: int


def restamp(batch: ProducerBatch, identity: Identity, base_sequence: int) -> None:
    """Give a batch the broker provably never wrote a new identity: patch the header fields and the CRC.

    Only batches that were never possibly written get here (see `Partition.unwritten_tail`); the records
    (compressed or not) are untouched, so this is a header patch, not a rebuild.
    """
    buf = batch.buf
    assert buf is not None and not batch.possibly_written
    _IDENTITY.pack_into(buf, OFF_PRODUCER_ID, identity.producer_id, identity.epoch, base_sequence)
    rewrite_crc(buf, 0, len(buf))
    batch.producer_id, batch.producer_epoch, batch.base_sequence = identity.producer_id, identity.epoch, \
        base_sequence


class Partition:
    """Sequence bookkeeping of one partition for one producer."""

    __slots__ = ("identity", "next_seq", "unresolved", "resend", "acked_seq", "last_acked_offset",
                 "last_acked_batch", "blocked")

    def __init__(self) -> None:
        self.identity: Identity | None = None
        self.next_seq = 0
        # sequenced batches not yet acknowledged or failed, in sequence order
        self.unresolved: deque[ProducerBatch] = deque()
        # batches to send before anything new from the accumulator: sealed, waiting for a (new) identity
        self.resend: deque[ProducerBatch] = deque()
        self.acked_seq = -1  # the last sequence acknowledged at `identity`
        self.last_acked_offset = -1  # the offset of the last acknowledged record of this producer, any epoch
        # (pid, epoch, last sequence) of the batch holding last_acked_offset: what to look for in the log
        self.last_acked_batch: tuple[int, int, int] | None = None
        # a recovery decided on but waiting until none of this partition's batches is in a request
        self.blocked: object | None = None

    # -- what may be sent -------------------------------------------------------------------------------
    def in_request(self) -> bool:
        return any(b.in_request for b in self.unresolved)

    def retry_pending(self) -> bool:
        return any(not b.in_request for b in self.unresolved)

    def retry_ready(self) -> list[ProducerBatch]:
        """The batches to send again, in sequence order; only once nothing of the partition is in flight."""
        if self.blocked is not None or self.in_request():
            return []
        return [b for b in self.unresolved if not b.in_request]

    def may_send(self, count: int) -> bool:
        """Whether a new batch of `count` records may go out now without leaving the broker's duplicate window.

        If every unacknowledged batch were written and then retried, the 5 newest are exact duplicates the broker
        still caches; each older one must lie within DUPLICATE_WINDOW sequences of the newest record.
        """
        if len(self.unresolved) < CACHED_BATCHES:
            return True
        return self.next_seq + count - 1 - self.unresolved[0].base_sequence < DUPLICATE_WINDOW

    def overflows(self, count: int) -> bool:
        return self.next_seq + count - 1 > MAX_SEQUENCE

    def adopt(self, identity: Identity, first_sequence: int = 0) -> None:
        """Start sequences at a new producer id or epoch; only when nothing of the old one is unresolved."""
        assert not self.unresolved
        self.identity = identity
        self.next_seq = first_sequence
        self.acked_seq = first_sequence - 1

    def assign(self, batch: ProducerBatch) -> None:
        """Seal a new batch with the next sequences (or stamp a resent one with them) and track it."""
        assert self.identity is not None
        if batch.buf is None:
            batch.seal(self.identity.producer_id, self.identity.epoch, self.next_seq)
        else:
            restamp(batch, self.identity, self.next_seq)
        self.next_seq += batch.count
        self.unresolved.append(batch)

    # -- answers ----------------------------------------------------------------------------------------
    def is_head(self, batch: ProducerBatch) -> bool:
        """No earlier batch of this partition is unresolved: an error on it is about it, not a missing predecessor."""
        return bool(self.unresolved) and self.unresolved[0] is batch

    def acknowledged(self, batch: ProducerBatch, base_offset: int) -> None:
        """The broker has the batch (base_offset -1: a duplicate whose offset it no longer knows)."""
        self._drop(batch)
        if self.identity == (batch.producer_id, batch.producer_epoch) and batch.last_sequence > self.acked_seq:
            self.acked_seq = batch.last_sequence
        if base_offset >= 0:
            last = base_offset + batch.count - 1
            if last > self.last_acked_offset:
                self.last_acked_offset = last
                self.last_acked_batch = (batch.producer_id, batch.producer_epoch, batch.last_sequence)

    def fail_from(self, batch: ProducerBatch) -> list[ProducerBatch]:
        """KIP-360: `batch` failed for good, so every later sequenced batch fails with it. Returns them all."""
        out: list[ProducerBatch] = []
        keep: deque[ProducerBatch] = deque()
        hit = False
        for b in self.unresolved:
            if b is batch:
                hit = True
            (out if hit else keep).append(b)
        self.unresolved = keep
        return out

    def unwritten_tail(self, batch: ProducerBatch) -> list[ProducerBatch] | None:
        """`batch` and every later unresolved batch, if the broker provably wrote none of them; else None.

        The broker appends a producer's batches strictly in sequence order, so if `batch` was never written
        (every attempt was answered, none ambiguously) nothing after it at the same epoch was either.
        """
        if batch.possibly_written:
            return None
        return self.fail_from(batch)

    def _drop(self, batch: ProducerBatch) -> None:
        try:
            self.unresolved.remove(batch)
        except ValueError:
            pass


class Idempotence:
    """The producer's identity and its partitions' sequences; epoch bumps for the idempotent producer.

    An idempotent producer bumps its epoch itself (KIP-360: the broker accepts a higher epoch at sequence 0);
    at the last epoch it needs a new producer id. A transactional producer gets new epochs from its
    coordinator only (transactions.py); `bump_local` is never used for it.
    """

    def __init__(self, initial_sequence: int = 0) -> None:
        self.identity: Identity | None = None
        self.partitions: dict[tuple[str, int], Partition] = {}
        self._initial_sequence = initial_sequence
        self.bump_requested = False
        self.bumps = 0

    def partition(self, tp: tuple[str, int]) -> Partition:
        part = self.partitions.get(tp)
        if part is None:
            part = self.partitions[tp] = Partition()
        return part

    def set_identity(self, identity: Identity) -> None:
        """A producer id and epoch from InitProducerId (or a local bump); partitions adopt it when quiet."""
        self.identity = identity
        self.bump_requested = False

    def first_sequence(self, part: Partition) -> int:
        """The test hook `oncelog.test.initial.sequence` starts a partition's very first sequences (only those:
        after an epoch bump every partition starts at 0 as the broker requires)."""
        return self._initial_sequence if part.identity is None else 0

    def ready_for_new(self, part: Partition) -> bool:
        """Whether the partition may take a new sequenced batch now (possibly after adopting the identity)."""
        if self.identity is None or self.bump_requested or part.blocked is not None or part.retry_pending():
            return False  # (a requested bump retires the current epoch: nothing new is stamped with it)
        if part.identity != self.identity:
            if part.unresolved:
                return False
            part.adopt(self.identity, self.first_sequence(part))
        return True

    def bump_local(self) -> bool:
        """Move to the next epoch without the broker; False when the epoch is exhausted (a new id is needed)."""
        assert self.identity is not None
        if self.identity.epoch + 1 >= MAX_EPOCH:
            return False
        self.bumps += 1
        self.set_identity(Identity(self.identity.producer_id, self.identity.epoch + 1))
        return True
