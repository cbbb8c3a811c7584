"""KIP-890 part 1 across brokers: before a partition leader takes a producer's first transactional batch, the
producer's transaction coordinator confirms the partition is in its ongoing transaction, wherever that
coordinator runs.

On the single node the coordinator is local and the partition asks it synchronously, inside the append
(`TransactionCoordinator.verify_partition`). In a cluster the coordinator of a transactional id is the leader of
its `__transaction_state` partition, often another broker. Then the produce path (and TxnOffsetCommit's write to
`__consumer_offsets`) first asks that broker with AddPartitionsToTxn v4 `verify_only` (Kafka's inter-broker form)
and only then appends; the append's synchronous check (`check`, installed as the partitions' verification hook)
takes the answer from here.

A confirmation is good for one append of that producer id and epoch on that partition, and only if no marker for
the producer reached the partition since the question was asked: a delayed batch of a transaction that was
committed or aborted meanwhile must not start a new, dangling one (the reason KIP-890 exists). Kafka keeps a
"verification guard" object in the producer's state for this; here every marker written through WriteTxnMarkers
bumps a generation per (partition, producer) that a confirmation must still match.

While the coordinator is unknown, loading, moving or unreachable the answer is NOT_ENOUGH_REPLICAS, which every
client retries for Produce (Kafka maps these cases the same way).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple, Protocol

from ..client.errors import KafkaError as ClientError
from ..coordinator.partitioning import partition_for
from ..coordinator.txn.coordinator import TXN_TOPIC
from ..errors import ErrorCode
from ..protocol.apis import ApiKey

if TYPE_CHECKING:
    from ..cluster.inter_broker import InterBroker
    from ..cluster.metadata_image import MetadataImage
    from ..storage.partition import Partition

log = logging.getLogger(__name__)

VERIFY_VERSION = 4                 # AddPartitionsToTxn v4: batched, with verify_only (broker to broker)
CONFIRMATION_TTL_S = 60.0          # a confirmation nobody used (the append failed before asking) is dropped
PRUNE_ABOVE = 10000                # bookkeeping entries kept before stale ones are dropped
# What the coordinator may answer that means "ask again shortly" rather than a verdict.
_RETRY = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.CONCURRENT_TRANSACTIONS,
                    ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.REQUEST_TIMED_OUT, ErrorCode.NETWORK_EXCEPTION})

TopicPartition = tuple[str, int]
Answer = tuple[ErrorCode, str | None]


class LocalTxnCoordinator(Protocol):
    """The transaction coordinator of this broker, as far as verification uses it."""

    def owner_error(self, txn_id: str) -> ErrorCode: ...

    def verify_partition(self, txn_id: str | None, producer_id: int, epoch: int, topic: str,
                         partition: int) -> Answer: ...


class _Confirmation(NamedTuple):
    epoch: int
    generation: int
    expires: float


class TxnVerifier:
    """Asks remote transaction coordinators, remembers their confirmations, answers the append's check."""

    def __init__(self, node_id: int, image: MetadataImage, inter_broker: InterBroker,
                 coordinator: LocalTxnCoordinator, timeout_s: float) -> None:
        self.node_id = node_id
        self.image = image
        self.inter_broker = inter_broker
        self.coordinator = coordinator
        self.timeout_s = timeout_s
        self._generations: dict[tuple[str, int, int], int] = {}
        self._confirmed: dict[tuple[str, int, int], _Confirmation] = {}

    # -- the produce path ---------------------------------------------------------------------------------------
    def needed(self, part: Partition, txn_id: str | None, producer_id: int, epoch: int,
               is_transactional: bool) -> bool:
        """Whether this batch must be confirmed by a remote coordinator before it is appended: the producer's
        first transactional batch on the partition, and its coordinator is not this broker. Not a batch at an
        epoch older than the partition knows: the append refuses it for its epoch first, as on one broker."""
        if not is_transactional or producer_id < 0 or not txn_id:
            return False
        if part.producers.open_transaction(producer_id) or part.producers.fenced(producer_id, epoch):
            return False
        return self.coordinator.owner_error(txn_id) == ErrorCode.NOT_COORDINATOR

    async def verify(self, txn_id: str, producer_id: int, epoch: int, partitions: Iterable[TopicPartition],
                     timeout_s: float | None = None) -> dict[TopicPartition, Answer]:
        """Ask the coordinator of `txn_id` whether each partition is in the producer's ongoing transaction; the
        confirmed ones are remembered for the append that follows. `timeout_s` (at most the inter-broker
        timeout): the caller's own deadline, e.g. the produce request's timeout."""
        timeout = self.timeout_s if timeout_s is None else max(0.001, min(self.timeout_s, timeout_s))
        tps = sorted(set(partitions))
        started = {tp: self._generations.setdefault((*tp, producer_id), 0) for tp in tps}
        coordinator = self.coordinator_of(txn_id)
        if coordinator is None:
            return {tp: (ErrorCode.NOT_ENOUGH_REPLICAS,
                         f"The transaction coordinator of {txn_id!r} is not available; retry") for tp in tps}
        by_topic: dict[str, list[int]] = {}
        for topic, index in tps:
            by_topic.setdefault(topic, []).append(index)
        request = {"transactions": [{
            "transactional_id": txn_id, "producer_id": producer_id, "producer_epoch": epoch, "verify_only": True,
            "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()],
        }]}
        try:
            response = await self.inter_broker.request(coordinator, ApiKey.ADD_PARTITIONS_TO_TXN, VERIFY_VERSION,
                                                       request, timeout)
        except Exception as exc:  # noqa: BLE001 - any failure to ask (connection, timeout, an answer that does not
            # decode) leaves the produce retriable, never an error the connection's other requests would share
            if not isinstance(exc, (ClientError, OSError, TimeoutError)):
                log.warning("verifying %s with broker %d failed: %r", txn_id, coordinator, exc)
            return {tp: (ErrorCode.NOT_ENOUGH_REPLICAS, f"The transaction coordinator of {txn_id!r} (broker "
                         f"{coordinator}) could not be asked ({exc}); retry") for tp in tps}
        codes: dict[TopicPartition, ErrorCode] = {}
        top = _code(response.error_code)
        for txn in response.results_by_transaction:
            for topic in txn.topic_results:
                for part in topic.results_by_partition:
                    codes[(topic.name, part.partition_index)] = _code(part.partition_error_code)
        answers: dict[TopicPartition, Answer] = {}
        expires = time.monotonic() + CONFIRMATION_TTL_S
        for tp in tps:
            code = top or codes.get(tp, ErrorCode.UNKNOWN_SERVER_ERROR)
            key = (*tp, producer_id)
            if code == ErrorCode.NONE and self._generations.get(key) == started[tp]:
                self._confirmed[key] = _Confirmation(epoch, started[tp], expires)
                answers[tp] = (ErrorCode.NONE, None)
            elif code == ErrorCode.NONE:
                answers[tp] = (ErrorCode.NOT_ENOUGH_REPLICAS,
                               f"A marker for producer {producer_id} reached {tp[0]}-{tp[1]} while its transaction "
                               "was being verified; retry")
            else:
                answers[tp] = _answer(code, txn_id, producer_id, epoch, tp, coordinator)
        self._prune()
        return answers

    def coordinator_of(self, txn_id: str) -> int | None:
        """The live broker that leads the `__transaction_state` partition of `txn_id`, as the image has it."""
        info = self.image.topics.get(TXN_TOPIC)
        if info is None or not info.assignment:
            return None
        state = self.image.partition(TXN_TOPIC, partition_for(txn_id, len(info.assignment)))
        if state is None or state.leader < 0 or not self.image.is_live(state.leader):
            return None
        return state.leader

    # -- the append's synchronous check (the partitions' verification hook) -----------------------------------
    def check(self, txn_id: str | None, producer_id: int, epoch: int, topic: str, partition: int) -> Answer:
        owner = self.coordinator.owner_error(txn_id) if txn_id else ErrorCode.NONE
        if owner == ErrorCode.NONE:
            return self.coordinator.verify_partition(txn_id, producer_id, epoch, topic, partition)
        if owner != ErrorCode.NOT_COORDINATOR:
            return ErrorCode.NOT_ENOUGH_REPLICAS, f"The transaction coordinator of {txn_id!r} is loading; retry"
        key = (topic, partition, producer_id)
        confirmed = self._confirmed.pop(key, None)
        generation = self._generations.pop(key, None)
        if confirmed is not None and confirmed.epoch == epoch and confirmed.generation == generation \
                and confirmed.expires > time.monotonic():
            return ErrorCode.NONE, None
        return ErrorCode.NOT_ENOUGH_REPLICAS, (
            f"The first transactional batch of producer {producer_id} on {topic}-{partition} is not verified with "
            f"the coordinator of {txn_id!r} yet; retry")

    def on_marker(self, topic: str, partition: int, producer_id: int) -> None:
        """A marker for the producer was written on the partition: what its coordinator confirmed before no
        longer holds."""
        key = (topic, partition, producer_id)
        self._confirmed.pop(key, None)
        if key in self._generations:
            self._generations[key] += 1

    def _prune(self) -> None:
        if len(self._generations) <= PRUNE_ABOVE and len(self._confirmed) <= PRUNE_ABOVE:
            return
        now = time.monotonic()
        self._confirmed = {k: c for k, c in self._confirmed.items() if c.expires > now}
        self._generations = {k: g for k, g in self._generations.items() if k in self._confirmed}


def _answer(code: ErrorCode, txn_id: str, producer_id: int, epoch: int, tp: TopicPartition,
            coordinator: int) -> Answer:
    """The coordinator's verdict as the producer should see it."""
    where = f"{tp[0]}-{tp[1]}"
    if code in _RETRY:
        return ErrorCode.NOT_ENOUGH_REPLICAS, (
            f"The transaction coordinator of {txn_id!r} (broker {coordinator}) answered {code.name}; retry")
    if code == ErrorCode.TRANSACTION_ABORTABLE:
        return code, f"{where} is not part of the ongoing transaction of {txn_id!r}"
    if code in (ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED):
        return ErrorCode.INVALID_PRODUCER_EPOCH, f"Producer {producer_id} epoch {epoch} is fenced"
    return code, f"The transaction coordinator of {txn_id!r} refused {where}: {code.name}"


def _code(value: int) -> ErrorCode:
    try:
        return ErrorCode(value)
    except ValueError:
        return ErrorCode.UNKNOWN_SERVER_ERROR
