"""The transaction coordinator: KIP-360's InitProducerId table, Kafka's state machine, and the
seeds' recovery rules (KAFKA-9803 timeouts), all in one place.

Every transition is written to `__transaction_state` and acknowledged (acks=all, through
the broker's partition access) before anyone is told about it; markers go to partitions
through `Partition.append_marker` when this broker leads them, as WriteTxnMarkers otherwise, and
`EndTxn` is answered once the markers are acknowledged, so a committed transaction is
visible to read_committed readers the moment `commit_transaction()` returns.

Ownership is per partition of `__transaction_state` (`..ownership`), as for the group
coordinator: `on_leadership(topic, partition, leader_epoch)` loads a partition's
transactional ids in the background (COORDINATOR_LOAD_IN_PROGRESS meanwhile),
`on_resignation(topic, partition)` drops them, ids of partitions not loaded here answer
NOT_COORDINATOR, and every write names the leader epoch of its load (also as the markers'
coordinator epoch, which partitions use to fence an older coordinator's markers). The
single node calls `startup()`, which owns every partition at epoch 0 and creates the log on
first use. In a cluster the markers of partitions other brokers lead go as WriteTxnMarkers
requests (the broker's marker channel), so a transaction a failed-over coordinator left in
PrepareCommit or PrepareAbort is finished by the next one wherever its partitions are.

Where the seeds go beyond Kafka:
- `last_producer_epoch` is persisted, so a retried InitProducerId(pid, epoch) whose first
  attempt succeeded before a restart is answered, not fenced (seed 000);
- a transaction that times out is aborted with the epoch bumped and the owner's epoch
  remembered as the last epoch (seed 002): the owner's requests at that epoch get answers
  its client treats as abortable, its EndTxn(ABORT) succeeds, its InitProducerId(pid,
  old epoch) returns the bumped epoch, and it goes on; a new instance still fences it;
- a transactional batch for a partition that is not in the producer's ongoing
  transaction is refused (KIP-890 part 1), so a zombie cannot start a dangling one.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import ErrorCode, KafkaError
from ...records.batch import read_header
from ...records.builder import NewRecord, build_batch
from ..ownership import SINGLE_NODE_EPOCH, Ownership, PartitionLoad
from ..partitioning import partition_for
from .log_format import decode_key, decode_value, encode_key, encode_value
from .metadata import EXHAUSTED_EPOCH, MAX_EPOCH, STATE_BY_NAME, TransactionMetadata, TxnState

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ...storage.partition import Partition
    from ..host import MarkerWriter, TransactionHost

log = logging.getLogger(__name__)

TXN_TOPIC = "__transaction_state"
OFFSETS_TOPIC = "__consumer_offsets"
# How long a transaction log write or a marker waits for the in-sync replicas (Kafka's coordinator waits
# request.timeout.ms, whose default this is).
WRITE_TIMEOUT_MS = 30000
# Records replayed between two turns of the event loop while a partition loads on a running broker.
LOAD_STEP = 1000
# Leadership answers of the partition access that mean "this broker does not coordinate this partition now".
_NOT_LEADER = frozenset({ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH,
                         ErrorCode.UNKNOWN_LEADER_EPOCH})

# Where a timed-out owner is told TRANSACTION_ABORTABLE (120) rather than UNKNOWN_PRODUCER_ID (59): only
# TxnOffsetCommit v4+. On EndTxn, AddPartitionsToTxn and AddOffsetsToTxn the Java client (4.4) handles 120
# without asking for an epoch bump, so its next transaction fails again, while 59 makes both it and
# librdkafka abort *and* bump; on TxnOffsetCommit the Java client has no case for 59 (fatal).
ABORTABLE_SINCE = {"TxnOffsetCommit": 4}
# First versions that know PRODUCER_FENCED (90); older ones get INVALID_PRODUCER_EPOCH.
FENCED_SINCE = {"AddPartitionsToTxn": 2, "AddOffsetsToTxn": 2, "EndTxn": 2, "InitProducerId": 4,
                "TxnOffsetCommit": 0}


def now_ms() -> int:
    return int(time.time() * 1000)


def _final_states(replayed: Iterable[tuple[str, TransactionMetadata | None]]) -> dict[str, TransactionMetadata]:
    """The last state of each id in a replay (a tombstone removes it)."""
    states: dict[str, TransactionMetadata | None] = {}
    for txn_id, meta in replayed:
        states[txn_id] = meta
    return {txn_id: meta for txn_id, meta in states.items() if meta is not None}


@dataclass
class InitResult:
    error: ErrorCode = ErrorCode.NONE
    producer_id: int = -1
    producer_epoch: int = -1


class TransactionCoordinator:
    def __init__(self, broker: TransactionHost) -> None:
        self.broker = broker
        self.config = broker.config
        self.txns: dict[str, TransactionMetadata] = {}
        self.by_producer: dict[int, str] = {}
        self.stats = {"timed_out": 0, "committed": 0, "aborted": 0, "fenced": 0}
        self.owned = Ownership(TXN_TOPIC)
        self._tasks: list[asyncio.Task] = []
        self._started = False
        # The single node (`startup`): it owns every partition and creates the log on first use. In a cluster the
        # log is created like any topic (the broker's FindCoordinator path) and partitions come from leadership.
        self._local = False

    # -- lifecycle ------------------------------------------------------------------------------------------
    @property
    def partitions(self) -> int:
        """The transaction log's partition count: the existing topic's, else transaction.state.log.num.partitions."""
        meta = self.broker.logs.topics.get(TXN_TOPIC)
        return meta.partitions if meta is not None else self.config["transaction.state.log.num.partitions"]

    def partition_for(self, txn_id: str) -> int:
        """The partition of the transaction log that holds `txn_id` (its coordinator is that partition's leader)."""
        return partition_for(txn_id, self.partitions)

    def _ensure_log(self) -> None:
        """Create the transaction log on first use, as Kafka does: brokers that never see a transactional
        producer do not carry its partitions."""
        logs = self.broker.logs
        if TXN_TOPIC not in logs.topics:
            logs.create_topic(TXN_TOPIC, self.partitions, {
                "cleanup.policy": "compact", "segment.bytes": logs.config["transaction.state.log.segment.bytes"]},
                internal=True)

    def startup(self) -> None:
        """The single node: own every partition of the transaction log at epoch 0, loaded now (before the broker
        listens); the log itself is created on first use."""
        self._local = True
        for p in range(self.partitions):
            if self.owned.get(p) is None:
                load = self.owned.begin(p, SINGLE_NODE_EPOCH)
                part = self.broker.logs.get_partition(TXN_TOPIC, p)
                self._install(load, _final_states(self._replay(part, p)) if part is not None else {})
        log.info("transaction coordinator loaded %d transactional ids", len(self.txns))

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._started = True
        self._resume(list(self.txns.values()))
        self._tasks = [
            loop.create_task(self._every(
                self.config["transaction.abort.timed.out.transaction.cleanup.interval.ms"], self.abort_timed_out)),
            loop.create_task(self._every(
                self.config["transaction.remove.expired.transaction.cleanup.interval.ms"], self.expire_ids)),
        ]

    async def stop(self) -> None:
        self._started = False
        tasks = [*self._tasks, *self.owned.tasks()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _resume(self, metas: Iterable[TransactionMetadata]) -> None:
        """Transactions whose coordinator stopped between PrepareX and CompleteX: finish the job (markers are
        idempotent)."""
        loop = asyncio.get_running_loop()
        for meta in metas:
            if meta.state.preparing and not meta.pending:
                meta.pending = True
                loop.create_task(self._complete(meta, meta.state == TxnState.PREPARE_COMMIT))

    # -- partition ownership (the broker's leadership of __transaction_state partitions) --------------------------
    def on_leadership(self, topic: str, partition: int, leader_epoch: int) -> None:
        """This broker became the leader of `topic`-`partition` at `leader_epoch` (only `__transaction_state`
        concerns this coordinator): load its transactional ids."""
        if topic == TXN_TOPIC:
            self.load_partition(partition, leader_epoch)

    def on_resignation(self, topic: str, partition: int) -> None:
        """This broker no longer leads `topic`-`partition`: drop its transactional ids."""
        if topic == TXN_TOPIC:
            self.unload_partition(partition)

    def load_partition(self, partition: int, leader_epoch: int) -> asyncio.Task | None:
        """Start loading `partition` in the background (its ids answer COORDINATOR_LOAD_IN_PROGRESS until done);
        nothing happens if it is loaded or loading at this epoch or a newer one, and a newer epoch than the one
        loaded reloads it from its log (leadership went elsewhere and came back)."""
        current = self.owned.get(partition)
        if current is not None:
            if leader_epoch <= current.leader_epoch:
                return current.task
            self.unload_partition(partition)
        load = self.owned.begin(partition, leader_epoch)
        load.task = asyncio.get_running_loop().create_task(self._load(load),
                                                           name=f"oncelog-load-{TXN_TOPIC}-{partition}")
        return load.task

    def unload_partition(self, partition: int) -> None:
        """Forget the ids of `partition`. Work in flight for them (a write, markers) finds its load gone and
        applies nothing; their transactions are finished by the next coordinator from the log."""
        load = self.owned.drop(partition)
        if load is None:
            return
        gone = [txn_id for txn_id in self.txns if self.partition_for(txn_id) == partition]
        for txn_id in gone:
            self._forget(txn_id)
        log.info("%s-%d unloaded (leader epoch %d): %d transactional ids are coordinated elsewhere now", TXN_TOPIC,
                 partition, load.leader_epoch, len(gone))

    @property
    def loading(self) -> bool:
        return self.owned.loading

    def owner_error(self, txn_id: str) -> ErrorCode:
        """NONE when this coordinator serves `txn_id`, else NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS (an
        empty id is let through: the request's own validation answers it)."""
        if not txn_id:
            return ErrorCode.NONE
        return self.owned.error(self.partition_for(txn_id))

    async def _load_pause(self) -> None:
        """Give the event loop a turn during a load (tests replace it to hold a load open)."""
        await asyncio.sleep(0)

    async def _load(self, load: PartitionLoad) -> None:
        p = load.partition
        started = time.monotonic()
        states: dict[str, TransactionMetadata | None] = {}
        try:
            await self._load_pause()
            part = self.broker.logs.get_partition(TXN_TOPIC, p)
            start: int | None = None
            while part is not None:
                end = part.log.log_end_offset
                for count, (txn_id, meta) in enumerate(self._replay(part, p, start), 1):
                    states[txn_id] = meta
                    if count % LOAD_STEP == 0:
                        await self._load_pause()
                if part.log.log_end_offset == end:
                    break
                start = end
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s-%d: loading transactional ids failed; the partition is not coordinated here",
                          TXN_TOPIC, p)
            if self.owned.is_current(load):
                self.owned.drop(p)
            return
        loaded = {txn_id: meta for txn_id, meta in states.items() if meta is not None}
        if self._install(load, loaded):
            log.info("%s-%d loaded at leader epoch %d: %d transactional ids in %.0f ms", TXN_TOPIC, p,
                     load.leader_epoch, len(loaded), (time.monotonic() - started) * 1000)

    @staticmethod
    def _replay(part: Partition, p: int,
                start: int | None = None) -> Iterator[tuple[str, TransactionMetadata | None]]:
        """(transactional id, its state or None for a tombstone) for each record from `start` to the log end."""
        for batch in part.iter_decoded_batches(start):
            if batch.header.is_control:
                continue
            for record in batch.records:
                if record.key is None:
                    continue
                try:
                    txn_id = decode_key(record.key)
                    meta = None if record.value is None else decode_value(txn_id, record.value)
                except Exception as exc:  # a damaged record must not stop the broker from starting
                    log.error("%s-%d: unreadable transaction log record at %d: %s", TXN_TOPIC, p, record.offset, exc)
                    continue
                yield txn_id, meta

    def _install(self, load: PartitionLoad, loaded: dict[str, TransactionMetadata]) -> bool:
        if not self.owned.finish(load):
            return False
        for meta in loaded.values():
            self._index(meta)
        if self._started:
            self._resume(list(loaded.values()))
        return True

    async def _every(self, interval_ms: int, action: Any) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                await action()
            except Exception:
                log.exception("transaction coordinator task %s failed", getattr(action, "__name__", action))

    def _index(self, meta: TransactionMetadata) -> None:
        old = self.txns.get(meta.transactional_id)
        if old is not None and self.by_producer.get(old.producer_id) == old.transactional_id:
            del self.by_producer[old.producer_id]
        self.txns[meta.transactional_id] = meta
        self.by_producer[meta.producer_id] = meta.transactional_id
        if meta.previous_producer_id >= 0:
            self.by_producer.setdefault(meta.previous_producer_id, meta.transactional_id)

    def _forget(self, txn_id: str) -> None:
        meta = self.txns.pop(txn_id, None)
        if meta is not None:
            for pid in (meta.producer_id, meta.previous_producer_id):
                if self.by_producer.get(pid) == txn_id:
                    del self.by_producer[pid]

    # -- persistence ----------------------------------------------------------------------------------------
    def _current(self, meta: TransactionMetadata) -> bool:
        """Whether `meta` is still the state of its id here (not dropped with its partition, not replaced by a
        reload): only then may what was decided from it be written or applied."""
        return self.txns.get(meta.transactional_id) is meta

    async def _persist(self, meta: TransactionMetadata, tombstone: bool = False) -> ErrorCode:
        """Append the metadata (or a tombstone) to the transaction log, under the leader epoch of the partition's
        load, and wait until it is acknowledged (acks=all)."""
        p = self.partition_for(meta.transactional_id)
        load = self.owned.loaded(p)
        if load is None:
            return ErrorCode.NOT_COORDINATOR
        if self._local:
            try:
                self._ensure_log()
            except Exception as exc:
                log.error("cannot create %s: %s", TXN_TOPIC, exc)
                return ErrorCode.COORDINATOR_NOT_AVAILABLE
        access = self.broker.partitions
        part = access.leader(TXN_TOPIC, p, load.leader_epoch)
        if isinstance(part, ErrorCode):
            log.warning("transaction log write for %s: %s-%d answers %s", meta.transactional_id, TXN_TOPIC, p,
                        part.name)
            return ErrorCode.NOT_COORDINATOR if part in _NOT_LEADER else ErrorCode.COORDINATOR_NOT_AVAILABLE
        refused = access.check_append(part, -1)
        if refused:
            return ErrorCode.NOT_COORDINATOR if refused in _NOT_LEADER else ErrorCode.COORDINATOR_NOT_AVAILABLE
        now = now_ms()
        value = None if tombstone else encode_value(meta)
        buf = build_batch([NewRecord(encode_key(meta.transactional_id), value, timestamp_ms=now)])
        result = part.append_records(buf, read_header(buf), now, False)
        if result.error:
            log.error("transaction log append for %s failed: %s", meta.transactional_id, result.message)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        try:
            await access.wait_acks_all(part, result.last_offset + 1, WRITE_TIMEOUT_MS)
        except Exception as exc:
            log.error("transaction log for %s is not acknowledged: %s", meta.transactional_id, exc)
            if isinstance(exc, KafkaError) and exc.code in _NOT_LEADER:
                return ErrorCode.NOT_COORDINATOR
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        return ErrorCode.NONE

    async def _transition(self, meta: TransactionMetadata, target: TransactionMetadata) -> ErrorCode:
        """Persist `target` as the new state of `meta`'s id, then (only then) apply it in memory; NOT_COORDINATOR
        when the id's partition was unloaded before or while the write went out (nothing is applied)."""
        if not self._current(meta):
            return ErrorCode.NOT_COORDINATOR
        target.last_update_ms = now_ms()
        error = await self._persist(target)
        if error:
            return error
        if not self._current(meta):
            return ErrorCode.NOT_COORDINATOR
        target.pending = meta.pending
        self._index(target)
        return ErrorCode.NONE

    # -- who is asking ----------------------------------------------------------------------------------------
    def _stale_owner(self, meta: TransactionMetadata, epoch: int) -> bool:
        """The rightful owner at the epoch the coordinator bumped on its behalf (timeout or client bump)."""
        return meta.last_producer_epoch >= 0 and epoch == meta.last_producer_epoch and epoch < meta.producer_epoch

    @staticmethod
    def _fenced(api: str, version: int) -> ErrorCode:
        return ErrorCode.PRODUCER_FENCED if version >= FENCED_SINCE.get(api, 0) else ErrorCode.INVALID_PRODUCER_EPOCH

    @staticmethod
    def _abortable(api: str, version: int) -> ErrorCode:
        """An answer every client treats as 'abort the transaction, bump the epoch and go on'
        (docs/client-reactions.md): UNKNOWN_PRODUCER_ID, except where ABORTABLE_SINCE says otherwise."""
        if version >= ABORTABLE_SINCE.get(api, 1 << 15):
            return ErrorCode.TRANSACTION_ABORTABLE
        return ErrorCode.UNKNOWN_PRODUCER_ID

    def _check_owner(self, meta: TransactionMetadata | None, producer_id: int, epoch: int, api: str,
                     version: int) -> ErrorCode:
        if meta is None or producer_id != meta.producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if epoch != meta.producer_epoch:
            if self._stale_owner(meta, epoch):
                return self._abortable(api, version)
            return self._fenced(api, version)
        return ErrorCode.NONE

    # -- InitProducerId --------------------------------------------------------------------------------------
    async def init_producer_id(self, txn_id: str, timeout_ms: int, producer_id: int, epoch: int,
                               version: int) -> InitResult:
        if txn_id == "":
            return InitResult(ErrorCode.INVALID_REQUEST)
        if timeout_ms <= 0 or timeout_ms > self.config["transaction.max.timeout.ms"]:
            return InitResult(ErrorCode.INVALID_TRANSACTION_TIMEOUT)
        owner = self.owner_error(txn_id)
        if owner:
            return InitResult(owner)
        meta = self.txns.get(txn_id)
        if meta is None:
            # In memory only until the first transition is persisted, as Kafka does; registering it now
            # makes a concurrent first InitProducerId for the same id see it.
            meta = TransactionMetadata(txn_id, self.broker.producer_ids.next_id(), timeout_ms=timeout_ms)
            self._index(meta)
        if meta.pending or meta.state.preparing:
            return InitResult(ErrorCode.CONCURRENT_TRANSACTIONS)
        given = producer_id >= 0
        if given and not (
            meta.producer_epoch == -1
            or producer_id == meta.producer_id
            or (producer_id == meta.previous_producer_id and epoch >= EXHAUSTED_EPOCH)
        ):
            return InitResult(self._fenced("InitProducerId", version))
        if meta.state == TxnState.ONGOING:
            # A new instance (or the owner skipping EndTxn) takes over: fence and abort what is open.
            await self._fence_and_abort(meta, timed_out=False)
            return InitResult(ErrorCode.CONCURRENT_TRANSACTIONS)
        target = meta.copy()
        target.timeout_ms = timeout_ms
        target.state = TxnState.EMPTY
        target.partitions = set()
        target.start_ms = -1
        target.timed_out = False
        if given and producer_id == meta.producer_id and epoch == meta.last_producer_epoch \
                and epoch != meta.producer_epoch:
            if meta.producer_epoch <= EXHAUSTED_EPOCH:
                # A retry of a bump that already happened (also across a restart): answer, do not fence.
                return InitResult(ErrorCode.NONE, meta.producer_id, meta.producer_epoch)
            # The coordinator fenced at the reserved epoch (a timeout at 32766): the owner continues under a
            # new producer id, so 32767 is never handed out and can always fence.
            target.previous_producer_id = meta.producer_id
            target.producer_id = self.broker.producer_ids.next_id()
            target.producer_epoch = 0
            target.last_producer_epoch = epoch
            return await self._apply_init(meta, target)
        if given and producer_id == meta.previous_producer_id and producer_id != meta.producer_id:
            # A retry of the bump that rotated the producer id, from the owner it was made for; anyone else
            # holding the old id is a zombie.
            if epoch == meta.last_producer_epoch:
                return InitResult(ErrorCode.NONE, meta.producer_id, meta.producer_epoch)
            return InitResult(self._fenced("InitProducerId", version))
        if meta.producer_epoch >= EXHAUSTED_EPOCH and (not given or epoch == meta.producer_epoch):
            target.previous_producer_id = meta.producer_id
            target.producer_id = self.broker.producer_ids.next_id()
            target.producer_epoch = 0
            target.last_producer_epoch = meta.producer_epoch if given else -1
        elif not given:
            target.producer_epoch = meta.producer_epoch + 1
            target.last_producer_epoch = -1
        elif epoch == meta.producer_epoch or meta.producer_epoch == -1:
            target.producer_epoch = meta.producer_epoch + 1
            target.last_producer_epoch = meta.producer_epoch
        else:
            return InitResult(self._fenced("InitProducerId", version))
        return await self._apply_init(meta, target)

    async def _apply_init(self, meta: TransactionMetadata, target: TransactionMetadata) -> InitResult:
        meta.pending = True
        try:
            error = await self._transition(meta, target)
        finally:
            meta.pending = False
            target.pending = False
        if error:
            return InitResult(error)
        return InitResult(ErrorCode.NONE, target.producer_id, target.producer_epoch)

    # -- adding partitions ------------------------------------------------------------------------------------
    async def add_partitions(self, txn_id: str, producer_id: int, epoch: int,
                             partitions: Iterable[tuple[str, int]], version: int,
                             api: str = "AddPartitionsToTxn") -> dict[tuple[str, int], ErrorCode]:
        wanted = list(partitions)
        owner = self.owner_error(txn_id)
        if owner:
            return {tp: owner for tp in wanted}
        meta = self.txns.get(txn_id)
        error = self._check_owner(meta, producer_id, epoch, api, version)
        if not error and (meta.pending or meta.state.preparing):
            error = ErrorCode.CONCURRENT_TRANSACTIONS
        if not error and meta.state not in (TxnState.ONGOING, TxnState.EMPTY, TxnState.COMPLETE_COMMIT,
                                            TxnState.COMPLETE_ABORT):
            error = ErrorCode.INVALID_TXN_STATE
        if error:
            return {tp: error for tp in wanted}
        unknown = [tp for tp in wanted if self.broker.partitions.leader_epoch(*tp) < 0]
        if unknown:
            return {tp: (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if tp in unknown else ErrorCode.OPERATION_NOT_ATTEMPTED)
                    for tp in wanted}
        if meta.state == TxnState.ONGOING and set(wanted) <= meta.partitions:
            return {tp: ErrorCode.NONE for tp in wanted}
        target = meta.copy()
        if meta.state != TxnState.ONGOING:
            target.start_ms = now_ms()
            target.partitions = set()
            target.timed_out = False
        target.state = TxnState.ONGOING
        target.partitions |= set(wanted)
        meta.pending = True
        try:
            error = await self._transition(meta, target)
        finally:
            meta.pending = False
            target.pending = False
        return {tp: error for tp in wanted}

    async def add_offsets(self, txn_id: str, producer_id: int, epoch: int, group_id: str,
                          version: int) -> ErrorCode:
        owner = self.owner_error(txn_id)
        if owner:
            return owner
        tp = (OFFSETS_TOPIC, self.offsets_partition(group_id))
        if self.broker.partitions.leader_epoch(*tp) < 0:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        results = await self.add_partitions(txn_id, producer_id, epoch, [tp], version, api="AddOffsetsToTxn")
        return results[tp]

    def offsets_partition(self, group_id: str) -> int:
        return partition_for(group_id, self.config["offsets.topic.num.partitions"])

    def check_txn_offset_commit(self, txn_id: str, producer_id: int, epoch: int, group_id: str,
                                version: int) -> ErrorCode:
        """TxnOffsetCommit is only valid inside the transaction that added the group's offsets partition.

        The request goes to the group's coordinator, which need not be this transaction's: when the id's partition
        is led elsewhere nothing is known here, and the offsets partition's producer state (epoch fencing) and
        its transaction verification decide, as in Kafka, which makes no such check."""
        owner = self.owner_error(txn_id)
        if owner == ErrorCode.NOT_COORDINATOR:
            return ErrorCode.NONE
        if owner:
            return owner
        meta = self.txns.get(txn_id)
        error = self._check_owner(meta, producer_id, epoch, "TxnOffsetCommit", version)
        if error:
            return error
        if meta.state != TxnState.ONGOING or (OFFSETS_TOPIC, self.offsets_partition(group_id)) not in meta.partitions:
            return ErrorCode.INVALID_TXN_STATE if version < 4 else ErrorCode.TRANSACTION_ABORTABLE
        return ErrorCode.NONE

    # -- ending -----------------------------------------------------------------------------------------------
    async def end_txn(self, txn_id: str, producer_id: int, epoch: int, commit: bool, version: int) -> ErrorCode:
        owner = self.owner_error(txn_id)
        if owner:
            return owner
        meta = self.txns.get(txn_id)
        if meta is None or producer_id != meta.producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if epoch != meta.producer_epoch:
            if not self._stale_owner(meta, epoch):
                return self._fenced("EndTxn", version)
            if meta.pending or meta.state.preparing:
                return ErrorCode.CONCURRENT_TRANSACTIONS
            if not commit and meta.state in (TxnState.COMPLETE_ABORT, TxnState.EMPTY):
                # The owner aborting what the coordinator already aborted for it (timeout): done.
                return ErrorCode.NONE
            return self._abortable("EndTxn", version)
        if meta.pending:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        state = meta.state
        if state == TxnState.ONGOING:
            return await self._end(meta, commit, meta.producer_epoch)
        if (state == TxnState.COMPLETE_COMMIT and commit) or (state == TxnState.COMPLETE_ABORT and not commit):
            return ErrorCode.NONE
        if state.preparing:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        return ErrorCode.INVALID_TXN_STATE

    async def _end(self, meta: TransactionMetadata, commit: bool, marker_epoch: int) -> ErrorCode:
        target = meta.copy()
        target.state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        target.producer_epoch = marker_epoch
        return await self._prepare_and_complete(meta, target, commit)

    async def _prepare_and_complete(self, meta: TransactionMetadata, target: TransactionMetadata,
                                    commit: bool) -> ErrorCode:
        """Persist PrepareX (`target`), then write the markers and persist CompleteX."""
        meta.pending = True
        error = await self._transition(meta, target)
        meta.pending = False
        if error:
            return error
        current = self.txns[meta.transactional_id]
        current.pending = True
        return await self._complete(current, commit)

    async def _complete(self, meta: TransactionMetadata, commit: bool) -> ErrorCode:
        """Write the markers, wait until they are acknowledged, then persist CompleteX.

        Markers carry the leader epoch of the transaction log partition's load as their coordinator epoch. The
        partitions this broker leads take them as local appends; in a cluster the others get them through the
        broker's marker channel (WriteTxnMarkers to their leaders). Until every marker is written the
        transaction stays PrepareX, and the timeout reaper retries it (`retry_unfinished`)."""
        load = self.owned.loaded(self.partition_for(meta.transactional_id))
        try:
            if load is None or not self._current(meta):
                return ErrorCode.NOT_COORDINATOR
            access = self.broker.partitions
            channel = self.broker.marker_channel
            waits = []
            remote: list[tuple[str, int]] = []
            now = now_ms()
            for topic, index in sorted(meta.partitions):
                part = access.leader(topic, index)
                if isinstance(part, ErrorCode):
                    if channel is not None:
                        remote.append((topic, index))
                        continue
                    if part == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                        continue  # the topic was deleted meanwhile
                    log.warning("marker for producer %d on %s-%d: %s; retried later", meta.producer_id, topic,
                                index, part.name)
                    return ErrorCode.COORDINATOR_NOT_AVAILABLE
                refused = access.check_append(part, -1)
                if refused:
                    log.warning("marker for producer %d on %s: %s; retried later", meta.producer_id, part.name,
                                refused.name)
                    return ErrorCode.COORDINATOR_NOT_AVAILABLE
                result = part.append_marker(meta.producer_id, meta.producer_epoch, commit, load.leader_epoch, now)
                if result.error:
                    log.warning("marker for producer %d on %s: %s", meta.producer_id, part.name, result.message)
                    if result.error == ErrorCode.KAFKA_STORAGE_ERROR:
                        return ErrorCode.COORDINATOR_NOT_AVAILABLE  # stays Prepare*: retried at the next start
                    continue
                if topic == OFFSETS_TOPIC:
                    # Offsets become visible (or are dropped) once the marker is in the log, as in Kafka.
                    groups = getattr(self.broker, "group_coordinator", None)
                    if groups is not None:
                        groups.complete_txn(meta.producer_id, commit, index)
                waits.append(access.wait_acks_all(part, result.last_offset + 1, WRITE_TIMEOUT_MS))
            if remote:
                assert channel is not None
                waits.append(self._remote_markers(channel, meta, commit, load.leader_epoch, remote))
            if waits:
                outcomes = await asyncio.gather(*waits, return_exceptions=True)
                if any(isinstance(o, BaseException) for o in outcomes):
                    return ErrorCode.COORDINATOR_NOT_AVAILABLE
            if not self._current(meta):
                return ErrorCode.NOT_COORDINATOR
            target = meta.copy()
            target.state = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
            target.partitions = set()
            error = await self._transition(meta, target)
            if not error:
                self.stats["committed" if commit else "aborted"] += 1
            return error
        finally:
            if load is not None and self.owned.is_current(load):
                current = self.txns.get(meta.transactional_id)
                if current is not None:
                    current.pending = False
            meta.pending = False

    @staticmethod
    async def _remote_markers(channel: MarkerWriter, meta: TransactionMetadata, commit: bool,
                              coordinator_epoch: int, partitions: list[tuple[str, int]]) -> None:
        """Markers for partitions other brokers lead; raises when some could not be written in time."""
        answers = await channel.write(meta.producer_id, meta.producer_epoch, commit, coordinator_epoch, partitions,
                                      WRITE_TIMEOUT_MS / 1000)
        late = sorted(tp for tp, error in answers.items() if error == ErrorCode.REQUEST_TIMED_OUT)
        if late:
            log.warning("markers for producer %d (%s) not written yet on %s; retried later", meta.producer_id,
                        meta.transactional_id, ", ".join(f"{t}-{p}" for t, p in late[:10]))
            raise KafkaError(ErrorCode.REQUEST_TIMED_OUT, "markers not written")

    async def _fence_and_abort(self, meta: TransactionMetadata, timed_out: bool) -> ErrorCode:
        """Bump the epoch and abort the open transaction with markers at the new epoch.

        On a timeout the owner's epoch becomes the last epoch (KAFKA-9803), so the owner can still abort and
        claim the bumped epoch; when a new instance takes over, the last epoch is cleared and the old one is
        fenced for good.
        """
        if meta.pending:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        target = meta.copy()
        target.last_producer_epoch = meta.producer_epoch if timed_out else -1
        target.producer_epoch = min(meta.producer_epoch + 1, MAX_EPOCH)
        target.state = TxnState.PREPARE_ABORT
        target.timed_out = timed_out
        self.stats["timed_out" if timed_out else "fenced"] += 1
        return await self._prepare_and_complete(meta, target, False)

    # -- background duties ------------------------------------------------------------------------------------
    async def abort_timed_out(self) -> int:
        await self.retry_unfinished()
        now = now_ms()
        expired = [m for m in self.txns.values()
                   if m.state == TxnState.ONGOING and not m.pending and m.start_ms + m.timeout_ms < now]
        for meta in expired:
            log.info("transaction %s (producer %d, epoch %d) timed out after %d ms: aborting",
                     meta.transactional_id, meta.producer_id, meta.producer_epoch, meta.timeout_ms)
            await self._fence_and_abort(meta, timed_out=True)
        return len(expired)

    async def retry_unfinished(self) -> int:
        """Finish transactions whose decision is in the log but whose markers or CompleteX could not be
        written (a full disk answered KAFKA_STORAGE_ERROR): Kafka's marker channel retries until it succeeds;
        so does this, on the timeout reaper's schedule, instead of leaving the LSO stuck until a restart."""
        stuck = [m for m in self.txns.values() if m.state.preparing and not m.pending]
        for meta in stuck:
            meta.pending = True
            await self._complete(meta, meta.state == TxnState.PREPARE_COMMIT)
        return len(stuck)

    async def expire_ids(self) -> int:
        limit = self.config["transactional.id.expiration.ms"]
        now = now_ms()
        gone = [m for m in self.txns.values()
                if m.state.idle and not m.pending and m.last_update_ms <= now - limit]
        for meta in gone:
            if not self._current(meta):
                continue
            meta.pending = True
            error = await self._persist(meta, tombstone=True)
            meta.pending = False
            if not error and self._current(meta):
                self._forget(meta.transactional_id)
                log.info("transactional id %s expired", meta.transactional_id)
        return len(gone)

    # -- the partition side (KIP-890 part 1) ------------------------------------------------------------------
    def verify_partition(self, txn_id: str | None, producer_id: int, epoch: int, topic: str,
                         partition: int) -> tuple[ErrorCode, str | None]:
        """May this producer's transactional batch start a transaction on (topic, partition)?"""
        meta = self.txns.get(txn_id) if txn_id is not None else None
        if meta is None or meta.producer_id != producer_id:
            return ErrorCode.TRANSACTION_ABORTABLE, (
                f"Producer {producer_id} has no transaction with id {txn_id!r} on this coordinator")
        if epoch != meta.producer_epoch:
            if self._stale_owner(meta, epoch):
                return ErrorCode.TRANSACTION_ABORTABLE, self._stale_message(meta)
            return ErrorCode.INVALID_PRODUCER_EPOCH, f"Producer {producer_id} epoch {epoch} is fenced"
        if meta.pending or meta.state.preparing:
            return ErrorCode.NOT_ENOUGH_REPLICAS, "The transaction is completing; retry"
        if meta.state != TxnState.ONGOING or (topic, partition) not in meta.partitions:
            return ErrorCode.TRANSACTION_ABORTABLE, (
                f"{topic}-{partition} is not part of the ongoing transaction of {txn_id!r}")
        return ErrorCode.NONE, None

    def stale_epoch_answer(self, producer_id: int, epoch: int,
                           client_software: str | None) -> tuple[ErrorCode, str] | None:
        """For a Produce refused for an old epoch: the abortable answer when the sender is the rightful owner
        whose epoch the coordinator bumped (its transaction timed out, KAFKA-9803); None for a fenced zombie,
        which keeps INVALID_PRODUCER_EPOCH (fatal for every client).

        No single code is abortable-with-epoch-bump for every client (docs/client-reactions.md): the Java
        client aborts on INVALID_PRODUCER_EPOCH from Produce, librdkafka and kafka-python only on
        UNKNOWN_PRODUCER_ID, so the answer follows what the client announced in ApiVersions.
        """
        txn_id = self.by_producer.get(producer_id)
        meta = self.txns.get(txn_id) if txn_id is not None else None
        if meta is None or meta.producer_id != producer_id or not self._stale_owner(meta, epoch):
            return None
        return self.stale_owner_code(client_software), self._stale_message(meta)

    @staticmethod
    def stale_owner_code(client_software: str | None) -> ErrorCode:
        """The Produce answer that makes this client abort, bump its epoch and go on (see stale_epoch_answer)."""
        java = (client_software or "").startswith("apache-kafka-java")
        return ErrorCode.INVALID_PRODUCER_EPOCH if java else ErrorCode.UNKNOWN_PRODUCER_ID

    @staticmethod
    def _stale_message(meta: TransactionMetadata) -> str:
        if meta.timed_out:
            return (f"The transaction of {meta.transactional_id!r} timed out after {meta.timeout_ms} ms and was "
                    "aborted by the coordinator; abort it and continue")
        return f"The epoch of {meta.transactional_id!r} was bumped; abort the transaction and continue"

    # -- operations (KIP-664) ---------------------------------------------------------------------------------
    def describe(self, txn_id: str) -> dict[str, Any]:
        meta = self.txns.get(txn_id)
        out: dict[str, Any] = {
            "error_code": 0, "transactional_id": txn_id, "transaction_state": "", "transaction_timeout_ms": 0,
            "transaction_start_time_ms": -1, "producer_id": -1, "producer_epoch": -1, "topics": [],
        }
        if not txn_id:
            out["error_code"] = ErrorCode.INVALID_REQUEST
        elif self.owner_error(txn_id):
            out["error_code"] = self.owner_error(txn_id)
        elif meta is None or meta.state == TxnState.DEAD:
            out["error_code"] = ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
        else:
            by_topic: dict[str, list[int]] = {}
            for topic, p in sorted(meta.partitions):
                by_topic.setdefault(topic, []).append(p)
            out.update(
                transaction_state=meta.state.display, transaction_timeout_ms=meta.timeout_ms,
                transaction_start_time_ms=meta.start_ms, producer_id=meta.producer_id,
                producer_epoch=meta.producer_epoch,
                topics=[{"topic": t, "partitions": ps} for t, ps in by_topic.items()],
            )
        return out

    def list_transactions(self, states: list[str], producer_ids: list[int], min_duration_ms: int = -1,
             pattern: str | None = None) -> tuple[list[str], list[dict[str, Any]]]:
        unknown = [s for s in states if s not in STATE_BY_NAME]
        wanted = {STATE_BY_NAME[s] for s in states if s in STATE_BY_NAME}
        now = now_ms()
        out = []
        for meta in self.txns.values():
            if states and meta.state not in wanted:
                continue
            if producer_ids and meta.producer_id not in producer_ids:
                continue
            if min_duration_ms >= 0 and (meta.state != TxnState.ONGOING or now - meta.start_ms < min_duration_ms):
                continue
            if pattern is not None and not fnmatch.fnmatchcase(meta.transactional_id, pattern):
                continue
            out.append({"transactional_id": meta.transactional_id, "producer_id": meta.producer_id,
                        "transaction_state": meta.state.display})
        return unknown, out

    def state_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for meta in self.txns.values():
            counts[meta.state.display] = counts.get(meta.state.display, 0) + 1
        return counts
