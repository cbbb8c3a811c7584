"""Produce requests out, answers in: the loop-thread half of the producer.

One task (`run`) drains ready batches per leader into Produce requests (one batch per partition per request,
as Kafka does), sends them pipelined up to max.in.flight.requests.per.connection per broker, and hands every
partition's answer to `_on_answer`, which applies the seeds' rules (idempotence.py has the reasoning):

- NONE → delivered; DUPLICATE_SEQUENCE_NUMBER → delivered, offset unknown (-1) (KAFKA-12207).
- retriable codes, and OUT_OF_ORDER_SEQUENCE / UNKNOWN_PRODUCER_ID on a batch behind an unresolved one → the
  same bytes again, in sequence order, after a backoff.
- UNKNOWN_PRODUCER_ID on the first unresolved batch (idempotent producer) → `_recover_unknown_producer`:
  the response's log start offset against the last acknowledged offset (seed 004), and where that cannot tell
  retention from loss, a look at the log itself.
- INVALID_RECORD / INVALID_TIMESTAMP with RecordErrors (KIP-467) → `_retry_without_culprits`.
- anything else → the batch and every later sequenced batch of the partition fail (KIP-360); the idempotent
  producer bumps its epoch, the transactional one becomes abortable (or fatal: fencing, id mapping).

Partition-wide decisions (a failure that takes later batches with it, a recovery) wait until none of the
partition's batches is in a request, so they see every answer first: `Partition.blocked`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from oncelog.errors import ErrorCode
from oncelog.protocol import client_codecs as codecs
from oncelog.protocol.apis import ApiKey
from oncelog.records.batch import iter_headers
from oncelog.records.builder import BatchBuilder
from oncelog.records.reader import decode_batch_records

from ..errors import (
    AbortableError,
    DataLossError,
    FatalError,
    KafkaError,
    KafkaTimeoutError,
    NetworkError,
    RecordError,
    RetriableError,
    error_for,
)
from .accumulator import ProducerBatch, RecordAccumulator
from .idempotence import Idempotence, Identity, Partition

if TYPE_CHECKING:
    from ..cluster import Cluster
    from .transactions import TransactionManager

log = logging.getLogger("oncelog.client.producer")

PRODUCE_MAX_VERSION = 11
PRODUCE_MIN_VERSION = 3
FETCH_MAX_VERSION = 12
FETCH_MIN_VERSION = 4
PROBE_BUDGET = 16 << 20  # bytes of log the producer reads to find out whether a batch was written

# Codes after which the broker may have appended the batch although it answered an error.
_MAYBE_WRITTEN = frozenset({ErrorCode.REQUEST_TIMED_OUT, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                            ErrorCode.NETWORK_EXCEPTION, ErrorCode.UNKNOWN_SERVER_ERROR,
                            ErrorCode.KAFKA_STORAGE_ERROR})
_METADATA_STALE = frozenset({ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                             ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.FENCED_LEADER_EPOCH,
                             ErrorCode.UNKNOWN_LEADER_EPOCH, ErrorCode.KAFKA_STORAGE_ERROR})
_KIP467 = frozenset({ErrorCode.INVALID_RECORD, ErrorCode.INVALID_TIMESTAMP})

# (base offset, log append time, error, {batch index: RecordError}) for one batch
Completion = Callable[[ProducerBatch, int, int, KafkaError | None, dict[int, RecordError] | None], None]


class Sender:
    """Drains the accumulator into Produce requests and applies the answers; runs on the client's loop."""

    def __init__(self, *, config: Any, cluster: Cluster, accumulator: RecordAccumulator,
                 idempotence: Idempotence | None, transactions: TransactionManager | None,
                 complete: Completion) -> None:
        self.cluster = cluster
        self.acc = accumulator
        self.idem = idempotence
        self.txn = transactions
        self.complete = complete
        self.acks = int(config["acks"])
        self.request_timeout = config["request.timeout.ms"] / 1000.0
        self.max_in_flight = config["max.in.flight.requests.per.connection"]
        self.max_request_bytes = max(config["message.max.bytes"], 1 << 20)
        self.retries = config["retries"]
        self.backoff = config["retry.backoff.ms"] / 1000.0
        self.backoff_max = max(config["retry.backoff.max.ms"] / 1000.0, self.backoff)
        self.transaction_timeout_ms = config["transaction.timeout.ms"]
        self.transactional_id = config["transactional.id"]
        self.wakeup = asyncio.Event()
        self.closing = False
        self.fatal: KafkaError | None = None
        self._in_flight: dict[int, int] = {}  # node -> Produce requests awaiting an answer
        self._tasks: set[asyncio.Task] = set()
        self._retry_batches: dict[tuple[str, int], list[ProducerBatch]] = {}  # non-idempotent retries
        self._metadata_wanted: set[str] = set()
        self._identity_task: asyncio.Task | None = None
        self._recoveries: set[tuple[str, int]] = set()
        self._sent_in_round = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        # what the rules did, for tests and metrics
        self.stats = {"requests": 0, "retries": 0, "duplicates": 0, "epoch_bumps": 0, "rebatched": 0,
                      "unknown_producer": 0, "unreachable": 0}

    # -- the loop -----------------------------------------------------------------------------------------
    def wake(self) -> None:
        self.wakeup.set()

    def busy(self) -> bool:
        """Whether any record is queued, in a Produce request or awaiting a retry (background metadata or
        identity requests do not count: a flush must not wait for them)."""
        if self._retry_batches or any(self._in_flight.values()):
            return True
        if self.idem is not None and any(p.unresolved or p.resend for p in self.idem.partitions.values()):
            return True
        with self.acc.lock:
            return not self.acc.empty()

    async def run(self) -> None:
        self.loop = asyncio.get_running_loop()
        while True:
            self.wakeup.clear()
            now = time.monotonic()
            try:
                next_due = await self._round(now)
            except Exception:  # a bug must not silently stop all delivery
                log.exception("producer sender round failed")
                next_due = now + self.backoff
            if self.closing and not self.busy():
                return
            timeout = max(0.0, min(next_due - time.monotonic(), 1.0))
            if timeout <= 0 and not self._sent_in_round:
                timeout = 0.001  # due but blocked (no free in-flight slot): do not spin
            self._sent_in_round = 0
            if timeout <= 0:
                await asyncio.sleep(0)  # never starve the answers and recoveries this loop waits for
            else:
                try:
                    await asyncio.wait_for(self.wakeup.wait(), timeout)
                except TimeoutError:
                    pass

    async def _round(self, now: float) -> float:
        next_due = now + 1.0
        self._fail_expired(now)
        if self.fatal is not None:
            self._fail_everything(self.fatal)
            return next_due
        if self.txn is not None and self.txn.last_error is not None and self.txn.in_error():
            # as the Java client does: what was not sent fails now with the transaction's error, so flush() and
            # commit_transaction() return at once instead of waiting for records that can only be aborted
            self.fail_queued(self.txn.last_error)
        if self.idem is not None:
            if self.txn is None and (self.idem.identity is None or self.idem.bump_requested):
                self._start_identity_task()
            self._run_recoveries()
        if self._metadata_wanted:
            topics, self._metadata_wanted = list(self._metadata_wanted), set()
            self._spawn(self._refresh_metadata(topics))
        plan, due = self._plan(now)
        next_due = min(next_due, due)
        for node, tps in plan.items():
            try:
                conn = await self.cluster.connection(node)
            except KafkaError as exc:
                log.debug("no connection to node %s: %s", node, exc)
                self.stats["unreachable"] += 1
                for tp in tps:
                    self._metadata_wanted.add(tp[0])
                next_due = min(next_due, time.monotonic() + self.backoff)
                continue
            self._send_node(node, conn, tps, time.monotonic())
        return next_due

    # -- what goes out --------------------------------------------------------------------------------------
    def _plan(self, now: float) -> tuple[dict[int, list[tuple[str, int]]], float]:
        """Partitions with something sendable, by leader; and when to look again otherwise."""
        due = now + 1.0
        plan: dict[int, list[tuple[str, int]]] = {}
        with self.acc.lock:
            candidates = set(self.acc.partitions())
            for tp in candidates:  # a lingering batch: look again when its linger.ms is up
                ready, when = self.acc.head_ready(tp, now)
                if ready is None:
                    due = min(due, when)
        for tp, waiting in self._retry_batches.items():
            candidates.add(tp)
            due = min(due, waiting[0].retry_at if waiting else due)
        if self.idem is not None:
            for tp, part in self.idem.partitions.items():
                if part.resend or part.retry_pending():
                    candidates.add(tp)
                    retries = part.retry_ready()  # empty while blocked or while any batch is in flight
                    if retries:
                        due = min(due, retries[0].retry_at)
        for tp in candidates:
            leader = self.cluster.leader_for(*tp)
            if leader is None or leader < 0:
                self._metadata_wanted.add(tp[0])
                due = min(due, now + self.backoff)
                continue
            if self._in_flight.get(leader, 0) >= self.max_in_flight:
                continue
            plan.setdefault(leader, []).append(tp)
        return plan, due

    def _send_node(self, node: int, conn: Any, tps: list[tuple[str, int]], now: float) -> None:
        """Fill up to the free in-flight slots of one broker with requests, one batch per partition each.

        A partition's batches go into requests of increasing index, and requests are written in index order, so
        its batches reach the broker in sequence order.
        """
        free = self.max_in_flight - self._in_flight.get(node, 0)
        requests: list[dict[tuple[str, int], ProducerBatch]] = []
        sizes: list[int] = []
        try:
            for tp in tps:
                taken = self._take(tp, now, free)
                slot = 0
                for j, batch in enumerate(taken):
                    while slot < len(requests) and (tp in requests[slot] or
                                                     sizes[slot] + len(batch.buf) > self.max_request_bytes):
                        slot += 1
                    if slot == len(requests):
                        if len(requests) >= free:
                            for rest in reversed(taken[j:]):  # no room: first next round, same identity
                                self._give_back(rest)
                            break
                        requests.append({})
                        sizes.append(0)
                    requests[slot][tp] = batch
                    sizes[slot] += len(batch.buf)
                    slot += 1
        except Exception:
            # what was taken for a request that will not go out must not stay marked as in one: that partition
            # would wait for an answer that never comes (and its batches would never expire)
            for request in requests:
                for batch in request.values():
                    self._give_back(batch)
            raise
        for request in requests:
            self._sent_in_round += 1
            self._in_flight[node] = self._in_flight.get(node, 0) + 1
            self._spawn(self._produce(node, conn, request))

    def _take(self, tp: tuple[str, int], now: float, limit: int) -> list[ProducerBatch]:
        """Up to `limit` batches of one partition to send now, in the order they must be written."""
        if self.fatal is not None or limit <= 0:
            return []
        if self.idem is None:
            return self._take_plain(tp, now, limit)
        part = self.idem.partition(tp)
        retries = part.retry_ready()
        if retries:
            if retries[0].retry_at > now:
                return []
            out = retries[:limit]
            for b in out:
                b.in_request = True
            return out
        if part.blocked is not None:
            return []
        if self.txn is not None and not self.txn.may_send(tp):
            return []
        out = []
        while len(out) < limit:
            with self.acc.lock:  # produce() must not add to the batch between the checks and the pop
                from_resend = bool(part.resend)
                batch = part.resend[0] if from_resend else self.acc.head_ready(tp, now)[0]
                if batch is None or not self.idem.ready_for_new(part):
                    break
                if part.overflows(batch.count):
                    self._sequence_overflow(part)
                    break
                if not part.may_send(batch.count):
                    break
                if from_resend:
                    part.resend.popleft()
                else:
                    self.acc.pop(tp)
            try:
                part.assign(batch)
            except Exception as exc:  # its bytes cannot be built: report it, do not lose it off the queue
                log.exception("could not build %r", batch)
                batch.done = True
                self.complete(batch, -1, -1, KafkaError(f"could not build the batch: {exc!r}"), None)
                continue
            batch.in_request = True
            out.append(batch)
        return out

    def _take_plain(self, tp: tuple[str, int], now: float, limit: int) -> list[ProducerBatch]:
        """Without idempotence: retries first, then new batches (Kafka's semantics: retries may reorder)."""
        out: list[ProducerBatch] = []
        retries = self._retry_batches.get(tp)
        while retries and len(out) < limit and retries[0].retry_at <= now:
            out.append(retries.pop(0))
        if retries is not None and not retries:
            del self._retry_batches[tp]
        while len(out) < limit:
            with self.acc.lock:
                batch, _ = self.acc.head_ready(tp, now)
                if batch is None:
                    break
                self.acc.pop(tp)
            try:
                batch.seal(-1, -1, -1)
            except Exception as exc:  # as for sequenced batches: reported failed, never dropped unreported
                log.exception("could not build %r", batch)
                batch.done = True
                self.complete(batch, -1, -1, KafkaError(f"could not build the batch: {exc!r}"), None)
                continue
            out.append(batch)
        for b in out:
            b.in_request = True
        return out

    def _give_back(self, batch: ProducerBatch) -> None:
        """A batch taken for a request that had no room: it goes out first next round, same identity."""
        batch.in_request = False
        if self.idem is None:
            self._retry_batches.setdefault(batch.tp, []).insert(0, batch)

    def _sequence_overflow(self, part: Partition) -> None:
        """KAFKA-12207: the next batch would pass 2^31-1; a new epoch starts sequences at 0 instead of wrapping."""
        assert self.idem is not None
        if self.txn is None:
            if not self.idem.bump_requested and part.identity == self.idem.identity:
                log.info("sequence space of producer %s exhausted on a partition: bumping the epoch",
                         self.idem.identity)
                self.idem.bump_requested = True
                self.wake()
        else:
            self.txn.sequence_exhausted()

    async def _produce(self, node: int, conn: Any, request: dict[tuple[str, int], ProducerBatch]) -> None:
        self.stats["requests"] += 1
        by_topic: dict[str, list[tuple[int, Any]]] = {}
        for (topic, partition), batch in request.items():
            batch.attempts += 1
            by_topic.setdefault(topic, []).append((partition, batch.buf))
        try:
            version = conn.api_version(ApiKey.PRODUCE, PRODUCE_MAX_VERSION, PRODUCE_MIN_VERSION)
            body = codecs.encode_produce_request(version, self.transactional_id, self.acks,
                                                 int(self.request_timeout * 1000), list(by_topic.items()))
            answer = await conn.request(ApiKey.PRODUCE, version, body, timeout=self.request_timeout,
                                        expect_response=self.acks != 0)
            if answer is None:  # acks=0: nothing to learn, nothing to retry
                for batch in request.values():
                    self._delivered(batch, -1, -1)
                return
            results = codecs.decode_produce_response(version, answer)
        except KafkaError as exc:
            for batch in request.values():
                self._on_request_failed(batch, exc)
            return
        except Exception as exc:  # a malformed answer: we cannot know what the broker did
            for batch in request.values():
                self._settle(batch, self._on_request_failed, NetworkError(f"bad Produce response: {exc!r}"))
            return
        except BaseException:  # cancelled: the request may have been written; never leave a batch "in a request"
            for batch in request.values():
                batch.in_request = False
                batch.possibly_written = True
            raise
        finally:
            self._in_flight[node] -= 1
            self.wake()
        answered: set[tuple[str, int]] = set()
        for topic_result in results:
            for p in topic_result.partitions:
                tp = (topic_result.name, p.partition)
                batch = request.get(tp)
                if batch is None:
                    continue
                answered.add(tp)
                self._settle(batch, self._on_answer, p)
        for tp, batch in request.items():
            if tp not in answered:
                self._settle(batch, self._on_request_failed,
                             NetworkError(f"the Produce response has no answer for {tp}"))

    def _settle(self, batch: ProducerBatch, handler: Callable[[ProducerBatch, Any], None], answer: Any) -> None:
        """Apply one partition's answer so that an exception there (a completion that raises) cannot strand it.

        A batch left marked as in a request blocks its partition for good: `Partition.retry_ready` and
        `ready_for_new` wait for it, `_fail_expired` skips it, and flush() waits until its timeout. So the batch
        leaves the request even when its handler fails, and if it is still unresolved it fails for good (with its
        followers, KIP-360) instead of waiting for an answer that was already consumed.
        """
        try:
            handler(batch, answer)
        except Exception as exc:
            log.exception("handling the answer for %r failed", batch)
            batch.in_request = False
            if not batch.done:
                try:
                    self._fail_batch_and_followers(batch, KafkaError(f"producer error handling the answer: {exc!r}"))
                except Exception:
                    log.exception("failing %r failed", batch)
        finally:
            batch.in_request = False

    # -- answers --------------------------------------------------------------------------------------------
    def _on_request_failed(self, batch: ProducerBatch, error: KafkaError) -> None:
        """No answer for the batch: the request failed as a whole. A network error leaves its fate open."""
        batch.in_request = False
        if batch.done:
            return
        if isinstance(error, NetworkError):
            batch.possibly_written = True
        if error.retriable:
            self._metadata_wanted.add(batch.topic)
            self._retry(batch, error)
        else:
            self._fail_batch_and_followers(batch, error)

    def _on_answer(self, batch: ProducerBatch, p: Any) -> None:
        batch.in_request = False
        if batch.done:
            return
        code = p.error_code
        if code == ErrorCode.NONE:
            self._delivered(batch, p.base_offset, p.log_append_time)
            return
        if code == ErrorCode.DUPLICATE_SEQUENCE_NUMBER and self.idem is not None:
            self.stats["duplicates"] += 1
            self._delivered(batch, -1, -1)  # already written, the broker no longer knows where
            return
        message = p.error_message
        if code in _MAYBE_WRITTEN:
            batch.possibly_written = True
        if code in _METADATA_STALE:
            self._metadata_wanted.add(batch.topic)
        part = self.idem.partition(batch.tp) if self.idem is not None else None
        if part is not None and part.blocked is not None:
            return  # the partition's recovery decides on every unresolved batch
        if code in _KIP467 and p.record_errors:
            self._retry_without_culprits(batch, code, p.record_errors, message)
            return
        if part is not None and code in (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, ErrorCode.UNKNOWN_PRODUCER_ID) \
                and not part.is_head(batch):
            # an earlier batch is missing on the broker: this one was refused because of it, not for itself
            self._retry(batch, None)
            return
        if _retriable(code):
            self._retry(batch, error_for(code, message))
            return
        if part is not None and code == ErrorCode.UNKNOWN_PRODUCER_ID and self.txn is None:
            self._block(part, lambda: self._recover_unknown_producer(batch, p.log_start_offset))
            return
        if code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER and self.txn is None:
            error: KafkaError = FatalError(
                (message or "out of order sequence") + ": the broker lost a batch it had acknowledged", code)
        elif code == ErrorCode.UNKNOWN_PRODUCER_ID and self.txn is not None:
            # the coordinator aborted a timed-out transaction (KAFKA-9803) or the producer's state is gone:
            # either way the transaction cannot commit, and abort_transaction() bumps the epoch
            error = error_for(code, message, transactional=True) or KafkaError(message, code)
        else:
            error = error_for(code, message, transactional=self.txn is not None) or KafkaError(message, code)
        self._fail_batch_and_followers(batch, error)

    def _delivered(self, batch: ProducerBatch, base_offset: int, log_append_time: int) -> None:
        if self.idem is not None:
            self.idem.partition(batch.tp).acknowledged(batch, base_offset)
        batch.done = True
        self.complete(batch, base_offset, log_append_time, None, None)

    def _retry(self, batch: ProducerBatch, error: KafkaError | None) -> None:
        """Send the same bytes again (in order, after a backoff) unless retries or delivery.timeout.ms ran out."""
        now = time.monotonic()
        if batch.attempts > self.retries or now >= batch.deadline:
            reason = error or KafkaError("the partition's earlier batch could not be delivered")
            failure = KafkaTimeoutError(
                f"{batch!r} not delivered after {batch.attempts} attempts (last error: {reason})"
                + (" — it may have been written" if batch.possibly_written else ""), reason.code)
            self._fail_batch_and_followers(batch, failure)
            return
        self.stats["retries"] += 1
        batch.retry_at = now + min(self.backoff * (2 ** max(0, batch.attempts - 1)), self.backoff_max)
        if self.idem is None:
            self._retry_batches.setdefault(batch.tp, []).append(batch)
        if error is not None:
            log.debug("retrying %r: %s", batch, error)

    def _fail_batch_and_followers(self, batch: ProducerBatch, error: KafkaError) -> None:
        """KIP-360: a batch that fails for good takes every later sequenced batch of its partition with it."""
        if self.idem is None:
            batch.done = True
            self.complete(batch, -1, -1, error, None)
            return
        part = self.idem.partition(batch.tp)
        self._block(part, lambda: self._fail_from(part, batch, error))

    async def _fail_from(self, part: Partition, batch: ProducerBatch, error: KafkaError) -> None:
        failed = part.fail_from(batch)
        if not batch.done and batch not in failed:
            failed.insert(0, batch)
        for b in failed:
            b.done = True
            self.complete(b, -1, -1, error if b is batch else _follower_error(error, batch), None)
        self._after_partition_failure(part, error)

    def _after_partition_failure(self, part: Partition, error: KafkaError) -> None:
        """Later batches need sequences the broker will accept: a new epoch (idempotent) or an abort."""
        assert self.idem is not None
        if self.txn is not None:
            self.txn.batch_failed(error)
            return
        if part.identity == self.idem.identity:
            self.idem.bump_requested = True

    def _block(self, part: Partition, action: Callable[[], Any]) -> None:
        """Run a partition-wide decision once none of its batches is in a request (so every answer is in)."""
        if part.blocked is None:
            part.blocked = action
            self.wake()

    def _run_recoveries(self) -> None:
        assert self.idem is not None
        for tp, part in self.idem.partitions.items():
            if part.blocked is not None and tp not in self._recoveries and not part.in_request():
                self._recoveries.add(tp)
                self._spawn(self._recover(tp, part))

    async def _recover(self, tp: tuple[str, int], part: Partition) -> None:
        action = part.blocked
        try:
            await action()  # type: ignore[misc]
        except Exception as exc:
            log.exception("recovery of %s failed", tp)
            for b in part.fail_from(part.unresolved[0]) if part.unresolved else []:
                b.done = True
                self.complete(b, -1, -1, KafkaError(f"producer recovery failed: {exc!r}"), None)
        finally:
            part.blocked = None
            self._recoveries.discard(tp)
            self.wake()

    # -- seed 004 / KIP-360: UNKNOWN_PRODUCER_ID --------------------------------------------------------------
    async def _recover_unknown_producer(self, batch: ProducerBatch, log_start_offset: int) -> None:
        """The broker has no state for this producer on the partition, and `batch` is the first unresolved one.

        Retention (seed 004): the log start offset is past the last offset this producer had acknowledged,
        so its records and then its state went the normal way. Expiry (KIP-360's producer.id.expiration): the
        records are still there but the broker forgot the idle producer; seed 004's offset comparison would
        call that data loss, so the producer looks at the log: its last acknowledged batch is still at its
        offset with its (pid, epoch, last sequence). Either way nothing acknowledged is missing: the epoch is
        bumped and the unresolved batches go out again under it, from sequence 0 — but only those the broker
        provably never wrote (seed 000): a batch with an ambiguous earlier attempt is looked for in the log
        after the last acknowledged offset; found, it is delivered at the offset found; not found in a log
        that still holds everything after that offset, it was never written; otherwise it fails rather than
        risk a duplicate. Anything else is data loss: DataLossError for the partition's unresolved batches.
        """
        assert self.idem is not None
        self.stats["unknown_producer"] += 1
        part = self.idem.partition(batch.tp)
        if batch.done or not part.unresolved:
            return
        head = part.unresolved[0]
        last_acked = part.last_acked_offset
        if last_acked < 0 or log_start_offset > last_acked:
            cause = "retention removed its records"
        elif await self._still_in_log(batch.tp, last_acked, part.last_acked_batch):
            cause = "the broker expired the idle producer's state; its acknowledged records are intact"
        else:
            error = DataLossError(
                f"{batch.topic}-{batch.partition}: the broker has no state for producer {head.producer_id} and "
                f"its log start offset {log_start_offset} does not explain it: the record acknowledged at offset "
                f"{last_acked} is gone")
            failed = part.fail_from(head)
            for b in failed:
                b.done = True
                self.complete(b, -1, -1, error, None)
            self._after_partition_failure(part, error)
            return
        log.info("%s-%s: UNKNOWN_PRODUCER_ID (%s): new epoch, resending", batch.topic, batch.partition, cause)
        tail = part.fail_from(head)
        uncertain = [b for b in tail if b.possibly_written]
        found: dict[int, int] = {}
        complete_scan = False
        if uncertain:
            found, complete_scan = await self._find_batches(batch.tp, max(last_acked + 1, log_start_offset),
                                                            uncertain, log_start_offset <= last_acked + 1)
        resend: list[ProducerBatch] = []
        for b in tail:
            if b.possibly_written:
                offset = found.get(id(b))
                if offset is not None:
                    b.done = True
                    part.last_acked_offset = max(part.last_acked_offset, offset + b.count - 1)
                    self.complete(b, offset, -1, None, None)
                    continue
                if not complete_scan:
                    b.done = True
                    self.complete(b, -1, -1, KafkaError(
                        f"{b!r} may have been written before the broker lost this producer's state and cannot "
                        f"be found in the log any more; not resent, to avoid a duplicate",
                        ErrorCode.UNKNOWN_PRODUCER_ID), None)
                    continue
                b.possibly_written = False  # the whole log after the last acknowledged offset does not have it
            resend.append(b)
        part.resend.extendleft(reversed(resend))
        if part.identity == self.idem.identity:
            self.idem.bump_requested = True

    async def _still_in_log(self, tp: tuple[str, int], offset: int, expected: tuple[int, int, int] | None) -> bool:
        """Whether the batch holding `offset` is this producer's acknowledged batch (pid, epoch, last sequence)."""
        if expected is None:
            return False
        async for _, header in self._log_headers(tp, offset, 1 << 20):
            if header.base_offset <= offset <= header.last_offset:
                return (header.producer_id, header.producer_epoch, header.last_sequence) == expected
            if header.base_offset > offset:
                return False
        return False

    async def _find_batches(self, tp: tuple[str, int], start: int, batches: list[ProducerBatch],
                            start_is_complete: bool) -> tuple[dict[int, int], bool]:
        """Offsets of `batches` found in the log from `start` on (by pid, epoch, base sequence); and whether the
        search covered everything after the last acknowledged offset up to the log end."""
        wanted = {(b.producer_id, b.producer_epoch, b.base_sequence): b for b in batches}
        found: dict[int, int] = {}
        reached_end = False
        async for _, header in self._log_headers(tp, start, PROBE_BUDGET, report_end=True):
            if header is None:
                reached_end = True
                break
            b = wanted.get((header.producer_id, header.producer_epoch, header.base_sequence))
            if b is not None and header.last_offset_delta + 1 == b.count:
                found[id(b)] = header.base_offset
        return found, reached_end and start_is_complete

    async def _log_headers(self, tp: tuple[str, int], start: int, budget: int, report_end: bool = False):
        """Batch headers of the partition from `start`, read with Fetch (read_uncommitted) up to `budget` bytes;
        with `report_end`, a final (None, None) when the high watermark was reached."""
        conn = await self.cluster.leader_connection(*tp)
        version = conn.api_version(ApiKey.FETCH, FETCH_MAX_VERSION, FETCH_MIN_VERSION)
        offset = start
        read = 0
        while read < budget:
            body = codecs.encode_fetch_request(version, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20,
                                               isolation_level=0, topics=[(tp[0], [(tp[1], offset, 1 << 20)])])
            answer = await conn.request(ApiKey.FETCH, version, body, timeout=self.request_timeout)
            result = codecs.decode_fetch_response(version, answer)
            parts = [p for name, ps in result.topics if name == tp[0] for p in ps if p.partition == tp[1]]
            if not parts or parts[0].error_code != 0:
                return
            fetched = parts[0]
            records = fetched.records
            progressed = False
            for _, header in iter_headers(records):
                if header.last_offset >= offset:
                    yield _, header
                offset = max(offset, header.next_offset)
                progressed = True
            read += len(records)
            if offset >= fetched.high_watermark:
                if report_end:
                    yield None, None
                return
            if not progressed:
                return

    # -- KIP-467 ------------------------------------------------------------------------------------------------
    def _retry_without_culprits(self, batch: ProducerBatch, code: int, record_errors: list[tuple[int, str | None]],
                                message: str | None) -> None:
        """Only the records the broker named fail, each with its message; the rest go out again, in order.

        The broker appended nothing of the batch. If no attempt of it was ambiguous, the broker provably never
        wrote it — and so none of the partition's later batches either (it writes a producer's batches in
        sequence order) — so the remainder and those later batches take the sequences from the failed batch's
        base on, at the same epoch: no duplicate, no gap, no reordering, and no epoch bump. In a transaction the
        rejection still makes the transaction abortable: committing it would silently drop the culprits from an
        all-or-nothing unit (the remainder then fails with the abort). After an ambiguous attempt the batch may be in the log already (a timestamp can leave the
        window between attempts): then the whole batch and its followers fail instead.
        """
        culprits = {index: RecordError(msg or ErrorCode(code).message, code, index)
                    for index, msg in record_errors if 0 <= index < batch.count}
        if batch.possibly_written or not culprits:
            error = error_for(code, message, transactional=self.txn is not None) or KafkaError(message, code)
            self._fail_batch_and_followers(batch, error)
            return
        if self.idem is None:
            self._resend_plain_without(batch, culprits)
            return
        part = self.idem.partition(batch.tp)
        self._block(part, lambda: self._rebatch(part, batch, culprits))

    async def _rebatch(self, part: Partition, batch: ProducerBatch, culprits: dict[int, RecordError]) -> None:
        if batch.done or batch not in part.unresolved:
            return
        tail = part.unwritten_tail(batch)
        assert tail is not None
        remainder = self._without(batch, culprits)
        self._report_culprits(batch, culprits)
        for b in tail[1:]:
            b.possibly_written = False  # cannot be in the log: `batch` never was, and it came first
        self.stats["rebatched"] += 1
        part.next_seq = batch.base_sequence
        part.resend.extendleft(reversed(([remainder] if remainder is not None else []) + tail[1:]))

    def _resend_plain_without(self, batch: ProducerBatch, culprits: dict[int, RecordError]) -> None:
        remainder = self._without(batch, culprits)
        self._report_culprits(batch, culprits)
        if remainder is not None:
            remainder.seal(-1, -1, -1)
            self._retry_batches.setdefault(batch.tp, []).insert(0, remainder)

    def _report_culprits(self, batch: ProducerBatch, culprits: dict[int, RecordError]) -> None:
        batch.done = True
        self.complete(batch, -1, -1, None, culprits)
        if self.txn is not None:
            # A transaction with a rejected record must not commit as if it were complete (an exactly-once
            # pipeline would lose the record for good): abortable. The others stay queued and fail with the abort.
            first = culprits[min(culprits)]
            self.txn.batch_failed(AbortableError(
                f"{len(culprits)} record(s) for {batch.topic}-{batch.partition} rejected by the broker (first: "
                f"record {first.batch_index}: {first.message}); the transaction cannot commit", first.code))

    def _without(self, batch: ProducerBatch, culprits: dict[int, RecordError]) -> ProducerBatch | None:
        """A new, unsealed batch of `batch`'s records minus the culprits (same timestamps, same callbacks)."""
        assert batch.buf is not None
        records = decode_batch_records(batch.buf)
        keep = [i for i in range(len(records)) if i not in culprits]
        if not keep:
            return None
        out = ProducerBatch(batch.topic, batch.partition, batch.buf[22] & 0x07, batch.transactional,
                            batch.records is not None, batch.deadline)
        assert isinstance(out.builder, BatchBuilder)
        for i in keep:
            r = records[i]
            callback = batch.records[i][4] if batch.records is not None else None
            out.append(r.key, r.value, r.headers, r.timestamp, callback)
        out.created = batch.created  # unsealed: Partition.assign gives it its identity and builds it
        if batch.records is not None:
            assert out.records is not None
            out.records = [batch.records[i] for i in keep]
        return out

    # -- expiry, fatal errors, identity -----------------------------------------------------------------------
    def _fail_expired(self, now: float) -> None:
        with self.acc.lock:
            expired = self.acc.expired(now)
        for batch in expired:
            batch.done = True
            self.complete(batch, -1, -1, KafkaTimeoutError(
                f"{batch.count} records for {batch.topic}-{batch.partition} not sent within delivery.timeout.ms"),
                None)
        if self.idem is not None:
            for part in self.idem.partitions.values():
                while part.resend and part.resend[0].deadline <= now:
                    batch = part.resend.popleft()
                    batch.done = True
                    self.complete(batch, -1, -1, KafkaTimeoutError(
                        f"{batch!r} not resent within delivery.timeout.ms"), None)
                if part.blocked is None:
                    for b in part.unresolved:
                        if not b.in_request and b.deadline <= now:
                            self._fail_batch_and_followers(b, KafkaTimeoutError(
                                f"{b!r} not delivered within delivery.timeout.ms"
                                + (" — it may have been written" if b.possibly_written else "")))
                            break

    def fail_queued(self, error: KafkaError) -> None:
        """Fail every batch that has not been sent (an aborting transaction, a fatal error, close)."""
        with self.acc.lock:
            queued = self.acc.drain_all()
        if self.idem is not None:
            for part in self.idem.partitions.values():
                queued.extend(part.resend)
                part.resend.clear()
        for tp in list(self._retry_batches):
            queued.extend(self._retry_batches.pop(tp))
        for batch in queued:
            if not batch.done:
                batch.done = True
                self.complete(batch, -1, -1, error, None)

    def fail_unresolved(self, error: KafkaError) -> None:
        """At close: every batch still waiting for an answer is reported failed (its fate stays unknown)."""
        if self.idem is not None:
            for part in self.idem.partitions.values():
                for b in part.fail_from(part.unresolved[0]) if part.unresolved else []:
                    if not b.done:
                        b.done = True
                        self.complete(b, -1, -1, error, None)

    def _fail_everything(self, error: KafkaError) -> None:
        self.fail_queued(error)
        if self.idem is not None:
            for part in self.idem.partitions.values():
                if part.unresolved and not part.in_request():
                    for b in part.fail_from(part.unresolved[0]):
                        b.done = True
                        self.complete(b, -1, -1, error, None)

    def _start_identity_task(self) -> None:
        if self._identity_task is None or self._identity_task.done():
            self._identity_task = self._spawn(self._update_identity())

    async def _update_identity(self) -> None:
        """Idempotent producer: a producer id at start, and a new epoch when one was asked for (KIP-360)."""
        assert self.idem is not None
        if self.txn is not None:
            return  # the transaction manager owns the identity
        if self.idem.identity is not None and self.idem.bump_requested and self.idem.bump_local():
            self.stats["epoch_bumps"] += 1
            log.info("idempotent producer bumped its epoch to %s", self.idem.identity)
            self.wake()
            return
        delay = self.backoff
        while not self.closing:
            try:
                conn = await self.cluster.any_connection()
                version = conn.api_version(ApiKey.INIT_PRODUCER_ID, 5, 0)
                data: dict[str, Any] = {"transactional_id": None, "transaction_timeout_ms": self.transaction_timeout_ms}
                if version >= 3:
                    data.update(producer_id=-1, producer_epoch=-1)
                resp = await conn.call(ApiKey.INIT_PRODUCER_ID, data, version=version, timeout=self.request_timeout)
                error = error_for(resp.error_code)
                if error is None:
                    self.idem.set_identity(Identity(resp.producer_id, resp.producer_epoch))
                    self.wake()
                    return
                if not error.retriable:
                    self.fatal = error
                    self.wake()
                    return
            except RetriableError as exc:
                log.debug("InitProducerId failed: %s", exc)
            except KafkaError as exc:
                self.fatal = exc
                self.wake()
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.backoff_max)

    async def _refresh_metadata(self, topics: list[str]) -> None:
        try:
            await self.cluster.refresh_metadata(topics, force=True)
        except KafkaError as exc:
            log.debug("metadata refresh failed: %s", exc)
            await asyncio.sleep(self.backoff)
        finally:
            self.wake()

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("producer task failed", exc_info=task.exception())

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _retriable(code: int) -> bool:
    try:
        return ErrorCode(code).retriable
    except ValueError:
        return False


def _follower_error(error: KafkaError, first: ProducerBatch) -> KafkaError:
    """The error of a batch failed only because an earlier one of its partition failed (KIP-360)."""
    cls = type(error) if type(error) is not RecordError else KafkaError
    return cls(f"an earlier batch of {first.topic}-{first.partition} failed ({error.name}: {error.message}); "
               f"records after it cannot be written without it", error.code)
