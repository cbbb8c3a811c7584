"""Reading one offset range of one partition, inside a Spark task, as Arrow record batches.

A task reads [start, end) where `end` was at or below the last stable offset when the driver planned it, so
under read_committed every transaction in the range is already decided and a replay reads the same records.
The fetch loop uses the client's connection and Fetch codec directly (no consumer: no group, no background
prefetch of data past `end`); the client's decoder drops control batches and aborted transactions; each Fetch
response becomes one Arrow batch. Connections live in the client's per-process cache, so the reused Python
worker of the next task or micro-batch does not reconnect.
"""

from __future__ import annotations

import bisect
import gc
import time
from collections.abc import Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from operator import itemgetter

import pyarrow as pa

from oncelog.client.cluster import Cluster
from oncelog.client.config import ClientConfig
from oncelog.client.consumer.decode import decode_fetch
from oncelog.client.errors import KafkaError, RequestTimedOut, RetriableError, error_for
from oncelog.client.runtime import cached, get_runtime
from oncelog.errors import ErrorCode
from oncelog.protocol import client_codecs, fetch_codec
from oncelog.protocol.apis import ApiKey
from oncelog.protocol.client_codecs import FetchedPartition
from oncelog.spark import topics
from oncelog.spark.offsets import DataLoss, OffsetRange
from oncelog.spark.options import ReadOptions
from oncelog.spark.schema import to_record_batch

# A task reads a planned range as fast as it can: larger responses than a consumer's default (1 MiB) mean
# fewer round trips and larger Arrow batches; a user's kafka.max.partition.fetch.bytes still wins.
DEFAULT_PARTITION_BYTES = 8 << 20
_offset_of = itemgetter(0)


def cluster_for(options: ReadOptions) -> tuple[Cluster, ClientConfig]:
    """The worker process's metadata and connections for these options, bootstrapped once and kept for the
    next tasks and micro-batches the reused worker runs (a reconnect per task would cost more than a chunk)."""
    conf = options.client_config()  # validated as consumer settings (by name or alias) when parsed
    conf.setdefault("max.partition.fetch.bytes", str(DEFAULT_PARTITION_BYTES))
    key = ("oncelog.spark.fetch-cluster", tuple(sorted(conf.items())))

    def make() -> tuple[Cluster, ClientConfig]:
        config = ClientConfig(conf, "consumer")
        cluster = Cluster(config)
        get_runtime().run(cluster.bootstrap())
        return cluster, config

    return cached(key, make)


async def _fetch(cluster: Cluster, topic: str, partition: int, offset: int, max_bytes: int, isolation: int,
                 max_wait_ms: int, timeout: float) -> FetchedPartition:
    conn = await cluster.leader_connection(topic, partition)
    version = conn.api_version(ApiKey.FETCH, fetch_codec.MAX_VERSION, fetch_codec.MIN_VERSION)
    body = client_codecs.encode_fetch_request(version, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=max_bytes,
                                              isolation_level=isolation,
                                              topics=[(topic, [(partition, offset, max_bytes)])])
    frame = await conn.request(ApiKey.FETCH, version, body, timeout=timeout)
    assert frame is not None
    result = client_codecs.decode_fetch_response(version, frame)
    if result.error_code:
        raise error_for(result.error_code, f"fetch {topic}-{partition}") or KafkaError(code=result.error_code)
    for name, parts in result.topics:
        for fp in parts:
            if name == topic and fp.partition == partition:
                return fp
    raise KafkaError(f"fetch {topic}-{partition}: the response has no answer for the partition")


def read_range(rng: OffsetRange, options: ReadOptions) -> Iterator[pa.RecordBatch]:
    """The records of `rng` as Arrow batches (one per Fetch response that had any), in offset order.

    The next Fetch is sent as soon as a response is decoded, before its Arrow batch is built and handed to
    Spark, so the broker reads the next chunk while this worker converts and ships the current one.
    """
    cluster, config = cluster_for(options)
    runtime = get_runtime()
    topic, partition = rng.topic, rng.partition
    max_bytes = config["max.partition.fetch.bytes"]
    request_timeout = config["request.timeout.ms"] / 1000
    backoff = config["retry.backoff.ms"] / 1000
    isolation = 1 if options.read_committed else 0
    # Transient trouble (leader moving, broker restarting) is retried for this long before the task fails
    # and Spark's own task retry takes over.
    deadline_s = max(60.0, 2 * request_timeout)
    deadline = time.monotonic() + deadline_s

    def send(offset: int) -> Future[FetchedPartition]:
        return runtime.submit(_fetch(cluster, topic, partition, offset, max_bytes, isolation, 500, request_timeout))

    position = rng.start
    pending = send(position)
    while position < rng.end:
        try:
            try:
                fp = pending.result(request_timeout + 5)
            except FutureTimeout:
                pending.cancel()
                raise RequestTimedOut(f"fetch {topic}-{partition} at {position}: no answer in "
                                      f"{request_timeout + 5:.0f} s") from None
            if fp.error_code:
                raise error_for(fp.error_code, f"fetch {topic}-{partition} at {position}") or KafkaError(
                    code=fp.error_code)
        except RetriableError as exc:
            if time.monotonic() > deadline:
                raise KafkaError(f"reading {topic}-{partition} [{rng.start}, {rng.end}) stalled at offset "
                                 f"{position} for {deadline_s:.0f} s: {exc}") from exc
            time.sleep(backoff)
            runtime.run(cluster.refresh_metadata([topic], force=True), timeout=request_timeout + 5)
            pending = send(position)
            continue
        except KafkaError as exc:
            if exc.code != ErrorCode.OFFSET_OUT_OF_RANGE:
                raise
            log_start = topics.offsets(options, [(topic, partition)], "earliest")[(topic, partition)]
            position = _skip_lost(rng, position, options, log_start)
            pending = send(position)
            continue
        with _no_cyclic_gc():
            decoded = decode_fetch(topic, partition, fp.records, position, read_committed=options.read_committed,
                                   aborted=fp.aborted_transactions)
            if decoded.size and position < decoded.next_offset < rng.end:
                pending = send(decoded.next_offset)  # prefetch while this chunk is converted and consumed
            records, kinds = decoded.records, decoded.kinds
            if records and records[-1][0] >= rng.end:
                records = records[:bisect.bisect_left(records, rng.end, key=_offset_of)]
                kinds = [k for k in kinds if k[0] < len(records)]
            chunk = to_record_batch(topic, partition, records, kinds, options.include_headers) if records else None
            del records, decoded.records[:]
        if chunk is not None:
            yield chunk
            deadline = time.monotonic() + deadline_s
        if decoded.size and decoded.next_offset > position:
            position = decoded.next_offset
            continue
        if fp.records.nbytes and not decoded.size:
            max_bytes *= 2  # one batch is larger than the fetch size: ask for more
            pending = send(position)
            continue
        # No data at `position` although the range was planned below the end of the log.
        end_now = fp.last_stable_offset if options.read_committed and fp.last_stable_offset >= 0 \
            else fp.high_watermark
        if end_now <= position and fp.high_watermark < rng.end:
            _lost(rng, position, f"the partition now ends at {fp.high_watermark}", options)
            return
        if time.monotonic() > deadline:
            raise KafkaError(f"reading {topic}-{partition} [{rng.start}, {rng.end}): no data at offset {position} "
                             f"for {deadline_s:.0f} s (high watermark {fp.high_watermark}, last stable offset "
                             f"{fp.last_stable_offset})")
        pending = send(position)


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Decoding a response and building its Arrow columns make container objects per record (the record's
    tuple, its headers list, the column lists), all freed by reference counting. Left on, the cyclic collector
    keeps rescanning the growing young generations while they are made: measured 5x slower (150k vs 770k
    records/s in one worker)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _skip_lost(rng: OffsetRange, position: int, options: ReadOptions, log_start: int) -> int:
    """Where to go on after OFFSET_OUT_OF_RANGE: the log start, when retention removed what we wanted."""
    if log_start > position:
        _lost(rng, position, f"the log now starts at {log_start} (retention or DeleteRecords removed "
                             f"{log_start - position} offsets)", options)
        return min(log_start, rng.end)
    _lost(rng, position, "the broker no longer has this offset", options)
    return rng.end


def _lost(rng: OffsetRange, position: int, why: str, options: ReadOptions) -> None:
    if options.fail_on_data_loss:
        raise DataLoss(f"{rng.topic}-{rng.partition}: offsets from {position} to {rng.end} planned for this "
                       f"batch cannot be read: {why}. Set failOnDataLoss=false to skip them.")
