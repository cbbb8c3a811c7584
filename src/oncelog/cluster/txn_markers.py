"""Transaction markers for partitions led by other brokers: WriteTxnMarkers to each partition's leader, wherever
the metadata image says it is, retried across leader changes and broker restarts until written or the deadline.

The transaction coordinator writes the markers of the partitions this broker leads itself (a local append); the
rest come here. A marker is done when its leader answers NONE, or an answer that retrying cannot change (the
producer's epoch there is newer: INVALID_PRODUCER_EPOCH; a newer coordinator wrote there:
TRANSACTION_COORDINATOR_FENCED), or when the topic is gone from the image (deleted meanwhile). Everything else
(no leader yet, NOT_LEADER_OR_FOLLOWER, too few in-sync replicas, a timeout, a broken connection) is retried after
the image changes or a short backoff. What is not done at the deadline is reported as not written, and the
coordinator leaves the transaction in PrepareCommit/PrepareAbort for its retry loop: markers are idempotent, so a
retry that writes a marker twice is harmless (the second closes nothing).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..client.errors import KafkaError as ClientError
from ..errors import ErrorCode
from ..protocol.apis import ApiKey

if TYPE_CHECKING:
    from .inter_broker import InterBroker
    from .metadata_image import ImageDelta, MetadataImage

log = logging.getLogger(__name__)

WRITE_TXN_MARKERS_VERSION = 1
BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)   # between rounds, unless the image changes first
# Answers after which a marker is written or can never be: retrying changes nothing.
FINAL = frozenset({ErrorCode.NONE, ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.TRANSACTION_COORDINATOR_FENCED,
                   ErrorCode.INVALID_PRODUCER_ID_MAPPING})

TopicPartition = tuple[str, int]


class MarkerChannel:
    """WriteTxnMarkers from this broker's transaction coordinator to the leaders of other brokers' partitions."""

    def __init__(self, node_id: int, image: MetadataImage, inter_broker: InterBroker) -> None:
        self.node_id = node_id
        self.image = image
        self.inter_broker = inter_broker
        self._changed = asyncio.Event()
        image.subscribe(self._on_delta)

    def _on_delta(self, delta: ImageDelta) -> None:
        if delta.partitions or delta.brokers_changed or delta.topics_removed:
            self._changed.set()

    def close(self) -> None:
        self.image.unsubscribe(self._on_delta)

    async def write(self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                    partitions: Iterable[TopicPartition], timeout_s: float) -> dict[TopicPartition, ErrorCode]:
        """Write the marker on every partition; the answer per partition: NONE (written, or the topic is gone),
        a final refusal (see FINAL), or REQUEST_TIMED_OUT for what was still not written at the deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        pending = set(partitions)
        done: dict[TopicPartition, ErrorCode] = {}
        attempt = 0
        while pending:
            self._changed.clear()
            by_leader: dict[int, list[TopicPartition]] = {}
            for tp in sorted(pending):
                if self.image.assignment(*tp) is None:
                    done[tp] = ErrorCode.NONE          # deleted meanwhile: nothing left to close
                    continue
                state = self.image.partition(*tp)
                if state is not None and state.leader >= 0 and self.image.is_live(state.leader):
                    by_leader.setdefault(state.leader, []).append(tp)
            pending -= done.keys()
            remaining = deadline - loop.time()
            if not pending or remaining <= 0:
                break
            rounds = [self._send(node, tps, producer_id, producer_epoch, commit, coordinator_epoch, remaining)
                      for node, tps in by_leader.items()]
            for answers in await asyncio.gather(*rounds):
                for tp, error in answers.items():
                    if error in FINAL:
                        done[tp] = error
                        pending.discard(tp)
                        if error:
                            log.warning("marker for producer %d on %s-%d refused: %s", producer_id, *tp, error.name)
            if not pending:
                break
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            await self._wait_for_change(min(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)], remaining))
            attempt += 1
        for tp in pending:
            done[tp] = ErrorCode.REQUEST_TIMED_OUT
        return done

    async def _wait_for_change(self, seconds: float) -> None:
        try:
            async with asyncio.timeout(seconds):
                await self._changed.wait()
        except TimeoutError:
            pass

    async def _send(self, node: int, tps: list[TopicPartition], producer_id: int, producer_epoch: int,
                    commit: bool, coordinator_epoch: int, timeout_s: float) -> dict[TopicPartition, ErrorCode]:
        by_topic: dict[str, list[int]] = {}
        for topic, index in tps:
            by_topic.setdefault(topic, []).append(index)
        request = {"markers": [{
            "producer_id": producer_id, "producer_epoch": producer_epoch, "transaction_result": commit,
            "topics": [{"name": t, "partition_indexes": ps} for t, ps in by_topic.items()],
            "coordinator_epoch": coordinator_epoch,
        }]}
        try:
            response = await self.inter_broker.request(node, ApiKey.WRITE_TXN_MARKERS, WRITE_TXN_MARKERS_VERSION,
                                                       request, timeout_s)
        except Exception as exc:  # noqa: BLE001 - connection, timeout or an undecodable answer: all retried
            if not isinstance(exc, (ClientError, OSError, TimeoutError)):
                log.warning("WriteTxnMarkers for producer %d to broker %d: %r", producer_id, node, exc)
            log.info("WriteTxnMarkers for producer %d to broker %d failed (%s); retrying", producer_id, node, exc)
            return {tp: ErrorCode.NETWORK_EXCEPTION for tp in tps}
        answers: dict[TopicPartition, ErrorCode] = {}
        for marker in response.markers:
            for topic in marker.topics:
                for part in topic.partitions:
                    answers[(topic.name, part.partition_index)] = _code(part.error_code)
        return answers


def _code(value: int) -> ErrorCode:
    try:
        return ErrorCode(value)
    except ValueError:
        return ErrorCode.UNKNOWN_SERVER_ERROR
