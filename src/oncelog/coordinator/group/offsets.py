"""The committed offsets of one group, and the commits that are not visible yet.

Three kinds of state per partition:
- committed: what OffsetFetch returns;
- in-flight plain commits: appended but not yet durable (counted, so `require_stable`
  answers UNSTABLE_OFFSET_COMMIT until they land, as Kafka does);
- transactional commits staged by a producer: in the log, but visible only once that
  producer's COMMIT marker is written; an ABORT drops them.

Every committed value remembers the offset of the `__consumer_offsets` batch it came
from. When a transaction commits, its offsets replace the current ones only where they
were written later in the log, so a plain commit made after a TxnOffsetCommit but before
the marker is not overwritten by the older transactional value (Kafka's rule).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

TopicPartition = tuple[str, int]


@dataclass(slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp: int = -1
    expire_timestamp: int = -1
    log_offset: int = -1  # base offset of the __consumer_offsets batch holding it

    def older_than(self, other: CommittedOffset) -> bool:
        return self.log_offset < other.log_offset


class GroupOffsets:
    def __init__(self) -> None:
        self.committed: dict[TopicPartition, CommittedOffset] = {}
        self.in_flight: dict[TopicPartition, int] = {}
        self.pending_txn: dict[int, dict[TopicPartition, CommittedOffset]] = {}

    # -- plain commits -------------------------------------------------------------------------------------
    def begin_commit(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            self.in_flight[tp] = self.in_flight.get(tp, 0) + 1

    def end_commit(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            left = self.in_flight.get(tp, 0) - 1
            if left > 0:
                self.in_flight[tp] = left
            else:
                self.in_flight.pop(tp, None)

    def put(self, tp: TopicPartition, value: CommittedOffset) -> bool:
        """Make `value` the committed offset unless a later write is already there."""
        current = self.committed.get(tp)
        if current is None or current.older_than(value):
            self.committed[tp] = value
            return True
        return False

    # -- transactional commits -----------------------------------------------------------------------------
    def stage(self, producer_id: int, tp: TopicPartition, value: CommittedOffset) -> None:
        self.pending_txn.setdefault(producer_id, {})[tp] = value

    def unstage(self, producer_id: int, values: dict[TopicPartition, CommittedOffset]) -> None:
        """Forget staged offsets whose write failed (unless a later write of the producer replaced them)."""
        staged = self.pending_txn.get(producer_id)
        if staged is None:
            return
        for tp, value in values.items():
            if staged.get(tp) is value:
                del staged[tp]
        if not staged:
            del self.pending_txn[producer_id]

    def complete(self, producer_id: int, commit: bool) -> int:
        """The producer's marker was written: apply (commit) or drop (abort); returns offsets applied."""
        staged = self.pending_txn.pop(producer_id, None)
        if not staged or not commit:
            return 0
        return sum(1 for tp, value in staged.items() if self.put(tp, value))

    def has_pending_from(self, producer_id: int) -> bool:
        return producer_id in self.pending_txn

    def is_unstable(self, tp: TopicPartition) -> bool:
        """A commit for `tp` is on its way (in flight, or in an undecided transaction)."""
        if tp in self.in_flight:
            return True
        return any(tp in staged for staged in self.pending_txn.values())

    # -- removal -------------------------------------------------------------------------------------------
    def drop_committed(self, partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Drop committed offsets only (expiry); staged transactional ones stay for their marker."""
        return [tp for tp in partitions if self.committed.pop(tp, None) is not None]

    def remove(self, partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Drop committed and staged offsets of `partitions`; returns those that had a committed offset."""
        removed = []
        for tp in partitions:
            for staged in self.pending_txn.values():
                staged.pop(tp, None)
            if self.committed.pop(tp, None) is not None:
                removed.append(tp)
        self.pending_txn = {pid: staged for pid, staged in self.pending_txn.items() if staged}
        return removed

    def remove_all(self) -> list[TopicPartition]:
        return self.remove(list(self.committed))

    @property
    def has_offsets(self) -> bool:
        return bool(self.committed or self.in_flight or self.pending_txn)

    def expired(self, now_ms: int, retention_ms: int, base: Callable[[CommittedOffset], int],
                keep_topics: set[str] | frozenset[str] = frozenset()) -> list[TopicPartition]:
        """Partitions whose offset is past retention, measured from `base(value)`.

        A commit that carries its own expiry (OffsetCommit v2-4 retention) uses it instead;
        topics in `keep_topics` and partitions with a commit in flight never expire.
        """
        out = []
        for tp, value in self.committed.items():
            if tp[0] in keep_topics or tp in self.in_flight:
                continue
            if value.expire_timestamp >= 0:
                if now_ms >= value.expire_timestamp:
                    out.append(tp)
            elif now_ms - base(value) >= retention_ms:
                out.append(tp)
        return out
