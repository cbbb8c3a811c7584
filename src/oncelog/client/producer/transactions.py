"""The transactional producer's state machine and its coordinator requests (KIP-98, KIP-360, KAFKA-9803).

States: UNINITIALIZED → READY (init_transactions) → IN_TRANSACTION (begin) → COMMITTING / ABORTING → READY.
Any non-fatal failure inside a transaction moves it to ABORTABLE_ERROR: commit is refused, abort recovers.
Fencing (PRODUCER_FENCED, INVALID_PRODUCER_EPOCH from the coordinator), INVALID_PRODUCER_ID_MAPPING and
authorization failures move it to FATAL_ERROR: the instance is done (DESIGN §3: the seed is wrong about the
id mapping; a zombie whose id expired must not process twice).

The abort is where the seeds' recovery happens: after EndTxn(ABORT) the producer sends InitProducerId with its
current (pid, epoch); the coordinator bumps the epoch (KIP-360) — also for the owner of a transaction its reaper
aborted on timeout, whose epoch it remembered (KAFKA-9803) — and every partition restarts its sequences at 0
under the new epoch. A fenced zombie gets INVALID_PRODUCER_EPOCH / PRODUCER_FENCED there instead: fatal.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from oncelog.errors import ErrorCode
from oncelog.protocol.apis import ApiKey

from ..errors import (
    AbortableError,
    FatalError,
    KafkaError,
    KafkaTimeoutError,
    NetworkError,
    RetriableError,
    error_for,
)
from .idempotence import MAX_SEQUENCE, Idempotence, Identity

if TYPE_CHECKING:
    from ..cluster import Cluster

log = logging.getLogger("oncelog.client.producer")

COORDINATOR_TRANSACTION = 1
COORDINATOR_GROUP = 0
# begin_transaction() moves to a new epoch first when a partition has used this much of its sequence space,
# so a transaction never needs more sequences than are left (KAFKA-12207: bump, never wrap).
SEQUENCE_HEADROOM = 1 << 30

_COORDINATOR_MOVED = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE})
# TxnOffsetCommit answers that end the transaction's chance to commit (the Java client's CommitFailedException)
_GROUP_ABORTABLE = frozenset({ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION,
                              ErrorCode.FENCED_INSTANCE_ID})


class State(enum.Enum):
    UNINITIALIZED = "Uninitialized"
    READY = "Ready"
    IN_TRANSACTION = "InTransaction"
    COMMITTING = "CommittingTransaction"
    ABORTING = "AbortingTransaction"
    ABORTABLE_ERROR = "AbortableError"
    FATAL_ERROR = "FatalError"


class TransactionManager:
    """One transactional.id's transactions; every method runs on the client's loop."""

    def __init__(self, *, config: Any, cluster: Cluster, idempotence: Idempotence, wake: Callable[[], None]) -> None:
        self.transactional_id: str = config["transactional.id"]
        self.timeout_ms: int = config["transaction.timeout.ms"]
        self.request_timeout = config["request.timeout.ms"] / 1000.0
        self.backoff = config["retry.backoff.ms"] / 1000.0
        self.backoff_max = max(config["retry.backoff.max.ms"] / 1000.0, self.backoff)
        self.cluster = cluster
        self.idem = idempotence
        self.wake = wake
        self.state = State.UNINITIALIZED
        self.last_error: KafkaError | None = None
        self.added: set[tuple[str, int]] = set()
        self._pending_add: set[tuple[str, int]] = set()
        self._adding: asyncio.Task | None = None
        self._offsets_groups: set[str] = set()
        self._sent_anything = False
        # an AddPartitionsToTxn went out and its answer was lost: the coordinator may have started the transaction
        self._maybe_started = False

    # -- what the sender asks ---------------------------------------------------------------------------------
    def may_send(self, tp: tuple[str, int]) -> bool:
        """Whether a new batch for `tp` may go out; starts AddPartitionsToTxn for a partition new to the transaction."""
        if self.state not in (State.IN_TRANSACTION, State.COMMITTING):
            return False
        if tp in self.added:
            self._sent_anything = True
            return True
        self._pending_add.add(tp)
        if self._adding is None or self._adding.done():  # (re)started: a task that died must not strand them
            self._adding = asyncio.get_running_loop().create_task(self._add_partitions())
        return False

    def batch_failed(self, error: KafkaError) -> None:
        """A batch of the transaction failed for good: the transaction cannot commit any more."""
        self._transition_to_error(error)

    def sequence_exhausted(self) -> None:
        self._transition_to_error(AbortableError(
            "a partition ran out of sequence numbers inside one transaction; abort it to move to a new epoch"))

    def _transition_to_error(self, error: KafkaError) -> None:
        if self.state == State.FATAL_ERROR:
            return
        if error.fatal:
            self.state = State.FATAL_ERROR
            self.last_error = error
        elif self.state in (State.IN_TRANSACTION, State.COMMITTING, State.ABORTABLE_ERROR):
            if self.state != State.ABORTABLE_ERROR:
                self.last_error = error if error.abortable else AbortableError(str(error), error.code)
            self.state = State.ABORTABLE_ERROR
        self.wake()

    def in_error(self) -> bool:
        return self.state in (State.ABORTABLE_ERROR, State.FATAL_ERROR)

    def check_usable(self) -> None:
        """Raise the error that ended the producer, if one did."""
        if self.state == State.FATAL_ERROR:
            assert self.last_error is not None
            raise self.last_error

    def check_produce(self) -> None:
        """produce() is only valid inside a transaction (as in confluent-kafka)."""
        self.check_usable()
        if self.state == State.ABORTABLE_ERROR:
            assert self.last_error is not None
            raise self.last_error
        if self.state != State.IN_TRANSACTION:
            raise KafkaError(f"produce() needs an open transaction (state: {self.state.value})")

    # -- the API ----------------------------------------------------------------------------------------------
    async def init_transactions(self, timeout: float) -> None:
        self.check_usable()
        if self.state not in (State.UNINITIALIZED, State.READY):
            raise KafkaError(f"init_transactions() is not valid in state {self.state.value}")
        await self._init_producer_id(time.monotonic() + timeout, bump=False)
        self.state = State.READY

    async def begin_transaction(self, timeout: float) -> None:
        self.check_usable()
        if self.state != State.READY:
            raise KafkaError(f"begin_transaction() is not valid in state {self.state.value}")
        if any(p.next_seq > MAX_SEQUENCE - SEQUENCE_HEADROOM for p in self.idem.partitions.values()
               if p.identity == self.idem.identity):
            log.info("transactional producer %s near the end of its sequence space: new epoch", self.transactional_id)
            await self._init_producer_id(time.monotonic() + timeout, bump=True)
        self.added.clear()
        self._pending_add.clear()
        self._offsets_groups.clear()
        self._sent_anything = False
        self._maybe_started = False
        self.last_error = None
        self.state = State.IN_TRANSACTION

    async def send_offsets(self, offsets: Iterable[Any], group_metadata: Any, timeout: float) -> None:
        """AddOffsetsToTxn to the transaction coordinator, then TxnOffsetCommit to the group coordinator."""
        self.check_produce()
        group_id, generation, member_id, instance_id = _group_fields(group_metadata)
        deadline = time.monotonic() + timeout
        ident = self._identity()
        if group_id not in self._offsets_groups:
            await self._coordinator_call(ApiKey.ADD_OFFSETS_TO_TXN, 4, {
                "transactional_id": self.transactional_id, "producer_id": ident.producer_id,
                "producer_epoch": ident.epoch, "group_id": group_id}, deadline)
            self._offsets_groups.add(group_id)
        topics: dict[str, list[dict[str, Any]]] = {}
        for tp in offsets:
            topics.setdefault(tp.topic, []).append({
                "partition_index": tp.partition, "committed_offset": tp.offset,
                "committed_leader_epoch": getattr(tp, "leader_epoch", None) or -1,
                "committed_metadata": getattr(tp, "metadata", None) or ""})
        data = {"transactional_id": self.transactional_id, "group_id": group_id,
                "producer_id": ident.producer_id, "producer_epoch": ident.epoch, "generation_id": generation,
                "member_id": member_id, "group_instance_id": instance_id,
                "topics": [{"name": name, "partitions": parts} for name, parts in topics.items()]}
        delay = self.backoff
        while True:
            try:
                conn = await self.cluster.coordinator(group_id, COORDINATOR_GROUP)
                version = conn.api_version(ApiKey.TXN_OFFSET_COMMIT, 4, 0)
                resp = await conn.call(ApiKey.TXN_OFFSET_COMMIT, _for_version(data, version), version=version,
                                       timeout=self.request_timeout)
                codes = {p.error_code for t in resp.topics for p in t.partitions} - {0}
                if not codes:
                    return
                code = codes.pop()
                if code in _COORDINATOR_MOVED:
                    self.cluster.invalidate_coordinator(group_id, COORDINATOR_GROUP)
                error = error_for(code, coordinator=True, transactional=True) or KafkaError(None, code)
                if code in _GROUP_ABORTABLE:
                    error = AbortableError(f"the consumer group moved on: {error}", code)
                if not error.retriable:
                    self._transition_to_error(error)
                    raise error
            except RetriableError as exc:
                log.debug("TxnOffsetCommit: %s", exc)
            if time.monotonic() + delay > deadline:
                raise KafkaTimeoutError("send_offsets_to_transaction() timed out")
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.backoff_max)

    async def commit(self, flush: Callable[[float], Awaitable[bool]], timeout: float) -> None:
        """Flush every batch, then EndTxn(COMMIT). An abortable failure on the way is raised; abort recovers."""
        self.check_usable()
        if self.state == State.ABORTABLE_ERROR:
            assert self.last_error is not None
            raise self.last_error
        if self.state not in (State.IN_TRANSACTION, State.COMMITTING):
            raise KafkaError(f"commit_transaction() is not valid in state {self.state.value}")
        deadline = time.monotonic() + timeout
        self.state = State.COMMITTING
        if not await flush(deadline):
            self.state = State.IN_TRANSACTION if self.state == State.COMMITTING else self.state
            raise KafkaTimeoutError("commit_transaction() timed out while flushing the transaction's records")
        self.check_usable()
        if self.state == State.ABORTABLE_ERROR:
            assert self.last_error is not None
            raise self.last_error
        await self._end_txn(True, deadline)
        self.state = State.READY

    async def abort(self, drain: Callable[[float], Awaitable[bool]], timeout: float) -> None:
        """Fail what was not sent, wait for what is in flight, EndTxn(ABORT), then bump the epoch (KIP-360)."""
        self.check_usable()
        if self.state not in (State.IN_TRANSACTION, State.COMMITTING, State.ABORTING, State.ABORTABLE_ERROR):
            raise KafkaError(f"abort_transaction() is not valid in state {self.state.value}")
        deadline = time.monotonic() + timeout
        failed = self.state == State.ABORTABLE_ERROR
        self.state = State.ABORTING
        if not await drain(deadline):
            raise KafkaTimeoutError("abort_transaction() timed out waiting for the records in flight")
        self.check_usable()
        adding = self._adding
        if adding is not None and not adding.done():
            # An AddPartitionsToTxn in flight may already have started the transaction at the coordinator:
            # decide on EndTxn after its answer, or the transaction stays open there until it times out.
            await asyncio.wait({adding}, timeout=max(0.0, deadline - time.monotonic()))
        if self.added or self._offsets_groups:
            await self._end_txn(False, deadline)
        elif self._maybe_started:
            # The coordinator may have applied an AddPartitionsToTxn whose answer was lost: without EndTxn its
            # transaction would stay Ongoing (holding back the LSO) until transaction.timeout.ms. If it was never
            # started, the coordinator answers INVALID_TXN_STATE: nothing to abort.
            await self._end_txn(False, deadline, not_started_ok=True)
        if failed or self._sent_anything:
            await self._init_producer_id(deadline, bump=True)
        self.state = State.READY
        self.last_error = None

    # -- coordinator requests ---------------------------------------------------------------------------------
    def _identity(self) -> Identity:
        ident = self.idem.identity
        if ident is None:
            raise KafkaError("the transactional producer has no producer id; call init_transactions() first")
        return ident

    async def _init_producer_id(self, deadline: float, *, bump: bool) -> None:
        """InitProducerId: a new instance's (pid, epoch), or with `bump` the next epoch of the current one."""
        data: dict[str, Any] = {"transactional_id": self.transactional_id, "transaction_timeout_ms": self.timeout_ms,
                                "producer_id": -1, "producer_epoch": -1}
        if bump and self.idem.identity is not None:
            data.update(producer_id=self.idem.identity.producer_id, producer_epoch=self.idem.identity.epoch)
        resp = await self._coordinator_call(ApiKey.INIT_PRODUCER_ID, 5, data, deadline, min_version=3)
        self.idem.set_identity(Identity(resp.producer_id, resp.producer_epoch))
        log.info("transactional producer %s: producer id %s epoch %s", self.transactional_id, resp.producer_id,
                 resp.producer_epoch)
        self.wake()

    async def _end_txn(self, commit: bool, deadline: float, not_started_ok: bool = False) -> None:
        ident = self._identity()
        await self._coordinator_call(ApiKey.END_TXN, 4, {
            "transactional_id": self.transactional_id, "producer_id": ident.producer_id,
            "producer_epoch": ident.epoch, "committed": commit}, deadline,
            accept=frozenset({ErrorCode.INVALID_TXN_STATE}) if not_started_ok else frozenset())

    async def _add_partitions(self) -> None:
        """AddPartitionsToTxn for the partitions the sender is waiting on, retried until they are in."""
        delay = self.backoff
        while self._pending_add and self.state in (State.IN_TRANSACTION, State.COMMITTING):
            batch = sorted(self._pending_add)
            ident = self._identity()
            topics: dict[str, list[int]] = {}
            for topic, partition in batch:
                topics.setdefault(topic, []).append(partition)
            data = {"v3_and_below_transactional_id": self.transactional_id,
                    "v3_and_below_producer_id": ident.producer_id, "v3_and_below_producer_epoch": ident.epoch,
                    "v3_and_below_topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}
            sent = False
            try:
                conn = await self.cluster.coordinator(self.transactional_id, COORDINATOR_TRANSACTION)
                version = conn.api_version(ApiKey.ADD_PARTITIONS_TO_TXN, 3, 0)
                sent = True
                resp = await conn.call(ApiKey.ADD_PARTITIONS_TO_TXN, data, version=version,
                                       timeout=self.request_timeout)
                sent = False  # answered: `added` says what the coordinator has
                codes: dict[tuple[str, int], int] = {}
                for t in resp.results_by_topic_v3_and_below:
                    for p in t.results_by_partition:
                        codes[(t.name, p.partition_index)] = p.partition_error_code
                errors = {c for c in codes.values() if c != 0}
                if not errors:
                    self.added.update(batch)
                    self._pending_add.difference_update(batch)
                    self.wake()
                    delay = self.backoff
                    continue
                # OPERATION_NOT_ATTEMPTED marks the partitions skipped because of another one's error
                code = min(errors, key=lambda c: c == ErrorCode.OPERATION_NOT_ATTEMPTED)
                if code in _COORDINATOR_MOVED:
                    self.cluster.invalidate_coordinator(self.transactional_id, COORDINATOR_TRANSACTION)
                error = error_for(code, coordinator=True, transactional=True) or KafkaError(None, code)
                if not error.retriable:
                    self._transition_to_error(error)
                    return
            except RetriableError as exc:
                log.debug("AddPartitionsToTxn: %s", exc)
                self._maybe_started |= sent and isinstance(exc, NetworkError)
            except KafkaError as exc:
                self._maybe_started |= sent
                self._transition_to_error(exc)
                return
            except Exception as exc:  # a bug here must end the transaction visibly, not strand its records
                self._maybe_started |= sent
                log.exception("AddPartitionsToTxn handling failed")
                self._transition_to_error(AbortableError(f"adding partitions to the transaction failed: {exc!r}"))
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.backoff_max)

    async def _coordinator_call(self, api_key: int, max_version: int, data: dict[str, Any], deadline: float,
                                min_version: int = 0, accept: frozenset[int] = frozenset()) -> Any:
        """One coordinator request, retried (with rediscovery) on retriable answers until `deadline`.

        Non-retriable answers are classified by `error_for(coordinator=True)`: fencing is fatal and ends the
        producer; anything else abortable moves the transaction to ABORTABLE_ERROR. Both are raised.
        """
        delay = self.backoff
        while True:
            try:
                conn = await self.cluster.coordinator(self.transactional_id, COORDINATOR_TRANSACTION)
                version = conn.api_version(api_key, max_version, min_version)
                resp = await conn.call(api_key, _for_version(data, version, api_key), version=version,
                                       timeout=self.request_timeout)
                code = resp.error_code
                if code == 0 or code in accept:
                    return resp
                if code in _COORDINATOR_MOVED:
                    self.cluster.invalidate_coordinator(self.transactional_id, COORDINATOR_TRANSACTION)
                error = error_for(code, getattr(resp, "error_message", None), coordinator=True,
                                  transactional=True) or KafkaError(None, code)
                if not error.retriable:
                    if api_key == ApiKey.INIT_PRODUCER_ID and not error.fatal:
                        error = FatalError(f"InitProducerId failed: {error}", code)
                    self._transition_to_error(error)
                    raise error
                log.debug("coordinator answered %s to API %s: retrying", error.name, api_key)
            except RetriableError as exc:
                log.debug("coordinator request %s failed: %s", api_key, exc)
            if time.monotonic() + delay > deadline:
                raise KafkaTimeoutError(f"transaction coordinator request (API {api_key}) timed out")
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.backoff_max)


def _for_version(data: dict[str, Any], version: int, api_key: int | None = None) -> dict[str, Any]:
    """Drop the fields an older version of the request does not have."""
    out = dict(data)
    if api_key == ApiKey.INIT_PRODUCER_ID and version < 3:
        out.pop("producer_id", None)
        out.pop("producer_epoch", None)
    if api_key is None and "generation_id" in out and version < 3:  # TxnOffsetCommit before v3
        for key in ("generation_id", "member_id", "group_instance_id"):
            out.pop(key, None)
    if api_key is None and "topics" in out and version < 2:
        for t in out["topics"]:
            for p in t["partitions"]:
                p.pop("committed_leader_epoch", None)
    return out


def _group_fields(group_metadata: Any) -> tuple[str, int, str, str | None]:
    """(group id, generation, member id, group instance id) from a consumer's group metadata or a group id."""
    if isinstance(group_metadata, str):
        return group_metadata, -1, "", None
    group_id = getattr(group_metadata, "group_id", None)
    if not group_id:
        raise KafkaError("send_offsets_to_transaction() needs the consumer's group metadata (or a group id)")
    return (group_id, getattr(group_metadata, "generation_id", -1), getattr(group_metadata, "member_id", ""),
            getattr(group_metadata, "group_instance_id", None))
