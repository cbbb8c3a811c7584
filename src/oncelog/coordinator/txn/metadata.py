"""Transaction metadata and Kafka's state machine (research §6.1).

`last_producer_epoch` is the seed's (KIP-360) "last epoch": the epoch a producer
instance held before the coordinator bumped it on that instance's behalf — a client
asking for a bump, or (KAFKA-9803) the reaper aborting a transaction that timed out.
A request carrying that epoch comes from the rightful owner, who may recover; any
other old epoch comes from a fenced zombie. Unlike Kafka, it is persisted, so the
distinction survives a restart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

MAX_EPOCH = 32767  # reserved: the coordinator can always fence with it
EXHAUSTED_EPOCH = 32766  # at or above this, InitProducerId rotates the producer id


class TxnState(IntEnum):
    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def display(self) -> str:
        return _NAMES[self]

    @property
    def idle(self) -> bool:
        """States from which a new transaction may begin (and an id may expire)."""
        return self in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)

    @property
    def preparing(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)


_NAMES = {
    TxnState.EMPTY: "Empty",
    TxnState.ONGOING: "Ongoing",
    TxnState.PREPARE_COMMIT: "PrepareCommit",
    TxnState.PREPARE_ABORT: "PrepareAbort",
    TxnState.COMPLETE_COMMIT: "CompleteCommit",
    TxnState.COMPLETE_ABORT: "CompleteAbort",
    TxnState.DEAD: "Dead",
    TxnState.PREPARE_EPOCH_FENCE: "PrepareEpochFence",
}
STATE_BY_NAME = {v: k for k, v in _NAMES.items()}


@dataclass
class TransactionMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int = -1
    last_producer_epoch: int = -1
    previous_producer_id: int = -1
    timeout_ms: int = 60000
    state: TxnState = TxnState.EMPTY
    partitions: set[tuple[str, int]] = field(default_factory=set)
    start_ms: int = -1
    last_update_ms: int = -1
    # Set while a transition is being persisted or markers are being written: other requests
    # for this id get CONCURRENT_TRANSACTIONS until it clears.
    pending: bool = False
    # Whether the last abort was the reaper's (timeout), for operators and metrics.
    timed_out: bool = False

    def copy(self) -> TransactionMetadata:
        clone = TransactionMetadata(**{k: getattr(self, k) for k in self.__dataclass_fields__})
        clone.partitions = set(self.partitions)
        return clone
