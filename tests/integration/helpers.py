"""Client helpers for the integration tests: produce and consume with real clients, read exact results.

Every consumer here runs in assign mode (no group protocol yet) and reads each assigned partition
from a given offset up to the high watermark it finds when it starts, then returns everything it
read as `Rec` tuples, so tests can compare exact lists: contents, offsets and nothing extra.
"""

from __future__ import annotations

import asyncio
import json
import struct
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import KafkaError as CKError
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from tests.conftest import kcat_path
from tests.support.wire import Wire

Headers = tuple[tuple[str, bytes | None], ...]


class Rec(NamedTuple):
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers = ()
    timestamp: int | None = None  # None: not compared


class Out(NamedTuple):
    """A record to produce."""

    partition: int
    key: bytes | None
    value: bytes | None
    headers: Headers = ()
    timestamp: int | None = None


def norm_headers(headers: Iterable[tuple[str, Any]] | None) -> Headers:
    return tuple((k, None if v is None else bytes(v)) for k, v in (headers or ()))


def strip_ts(recs: Iterable[Rec]) -> list[Rec]:
    return [r._replace(timestamp=None) for r in recs]


def expected_records(outs: Sequence[Out], offsets: Sequence[tuple[int, int]]) -> list[Rec]:
    """The records `outs` became, given the (partition, offset) each was acknowledged at."""
    recs = [Rec(p, o, out.key, out.value, out.headers, out.timestamp) for out, (p, o) in zip(outs, offsets, strict=True)]
    return sorted(recs, key=lambda r: (r.partition, r.offset))


def in_log_order(outs: Sequence[Out], start: dict[int, int] | None = None) -> list[Rec]:
    """Records produced in this order to partitions that held `start[p]` records before (default 0)."""
    next_offset = dict(start or {})
    recs = []
    for out in outs:
        o = next_offset.get(out.partition, 0)
        next_offset[out.partition] = o + 1
        recs.append(Rec(out.partition, o, out.key, out.value, out.headers, out.timestamp))
    return sorted(recs, key=lambda r: (r.partition, r.offset))


def wait_until(predicate: Callable[[], Any], timeout: float = 15.0, interval: float = 0.05, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


# -- the raw wire client ----------------------------------------------------------------------------------


def api_versions_ok(bootstrap: str, timeout: float = 10.0) -> bool:
    """A fresh connection gets a complete, error-free ApiVersions v3 answer."""
    from kafka.protocol.metadata import ApiVersionsRequest

    with Wire(bootstrap, timeout=timeout) as w:
        resp = w.request(ApiVersionsRequest[3](client_software_name="t", client_software_version="1"), 3)
    return resp.error_code == 0 and any(k.api_key == 0 for k in resp.api_keys)


def produce_request(topic: str, partition: int, batch: bytes | bytearray | None, *, acks: int = -1,
                    version: int = 9, timeout_ms: int = 10000) -> Any:
    from kafka.protocol.producer import ProduceRequest

    req = ProduceRequest[version]
    td = req.TopicProduceData
    pd = td.PartitionProduceData
    records = None if batch is None else bytes(batch)
    return req(transactional_id=None, acks=acks, timeout_ms=timeout_ms,
               topic_data=[td(name=topic, partition_data=[pd(index=partition, records=records)])])


def encode_framed(message: Any, version: int, correlation_id: int = 1, client_id: str = "wire-test") -> bytes:
    message.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(message.encode(version=version, header=True, framed=True))


def produce_raw(wire: Wire, topic: str, partition: int, batch: bytes | bytearray | None, *, acks: int = -1,
                version: int = 9, timeout_ms: int = 10000) -> Any:
    """One Produce request with one partition's records; returns that partition's response."""
    message = produce_request(topic, partition, batch, acks=acks, version=version, timeout_ms=timeout_ms)
    resp = wire.request(message, version, expect_response=acks != 0)
    if resp is None:
        return None
    (topic_resp,) = resp.responses
    assert topic_resp.name == topic
    (part,) = topic_resp.partition_responses
    assert part.index == partition
    return part


def list_offset_raw(wire: Wire, topic: str, partition: int, timestamp: int, version: int = 7) -> tuple[int, int, int]:
    """ListOffsets for one partition: (error code, offset, timestamp)."""
    from kafka.protocol.consumer import ListOffsetsRequest

    req = ListOffsetsRequest[version]
    lt = req.ListOffsetsTopic
    lp = lt.ListOffsetsPartition
    kwargs: dict[str, Any] = dict(replica_id=-1, topics=[lt(name=topic, partitions=[
        lp(partition_index=partition, timestamp=timestamp, current_leader_epoch=-1)])])
    if version >= 2:
        kwargs["isolation_level"] = 0
    resp = wire.request(req(**kwargs), version)
    (t,) = resp.topics
    (p,) = t.partitions
    return p.error_code, p.offset, p.timestamp


def fetch_raw(wire: Wire, topic: str, partition: int, offset: int, *, max_bytes: int = 1 << 20,
              version: int = 11, max_wait_ms: int = 0, replica_id: int = -1) -> Any:
    from kafka.protocol.consumer import FetchRequest

    req = FetchRequest[version]
    ft = req.FetchTopic
    fp = ft.FetchPartition
    kwargs: dict[str, Any] = dict(
        replica_id=replica_id, max_wait_ms=max_wait_ms, min_bytes=0, max_bytes=max_bytes, isolation_level=0,
        topics=[ft(topic=topic, partitions=[fp(partition=partition, fetch_offset=offset, log_start_offset=-1,
                                                partition_max_bytes=max_bytes, current_leader_epoch=-1)])],
    )
    if version >= 7:
        kwargs.update(session_id=0, session_epoch=-1, forgotten_topics_data=[])
    if version >= 11:
        kwargs["rack_id"] = ""
    resp = wire.request(req(**kwargs), version)
    (t,) = resp.responses
    (p,) = t.partitions
    return p


# -- confluent-kafka (librdkafka) -------------------------------------------------------------------------


def admin(bootstrap: str, **conf: Any) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, **conf})


def create_topic(bootstrap: str, name: str, partitions: int = 1, config: dict[str, str] | None = None,
                 replication_factor: int = 1) -> None:
    client = admin(bootstrap)  # must outlive its futures
    futures = client.create_topics([NewTopic(name, partitions, replication_factor, config=config or {})],
                                   operation_timeout=10)
    futures[name].result(timeout=15)


def ck_producer(bootstrap: str, **conf: Any) -> Producer:
    base = {"bootstrap.servers": bootstrap, "enable.idempotence": False, "acks": "all", "linger.ms": 5}
    base.update(conf)
    return Producer(base)


def ck_produce(bootstrap: str, topic: str, outs: Sequence[Out], timeout: float = 30.0,
               **conf: Any) -> list[tuple[int, int]]:
    """Produce with confluent-kafka; returns each record's acknowledged (partition, offset), in `outs` order."""
    producer = ck_producer(bootstrap, **conf)
    results: list[Any] = [None] * len(outs)

    def report(i: int) -> Callable[[Any, Any], None]:
        def cb(err: Any, msg: Any) -> None:
            results[i] = err if err is not None else (msg.partition(), msg.offset())

        return cb

    for i, out in enumerate(outs):
        kwargs: dict[str, Any] = {"key": out.key, "value": out.value, "partition": out.partition,
                                  "on_delivery": report(i)}
        if out.headers:
            kwargs["headers"] = list(out.headers)
        if out.timestamp is not None:
            kwargs["timestamp"] = out.timestamp
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    remaining = producer.flush(timeout)
    assert remaining == 0, f"{remaining} records still in flight after {timeout}s"
    errors = [r for r in results if not isinstance(r, tuple)]
    assert not errors, f"delivery failed: {errors[:3]}"
    return results


def ck_consume(bootstrap: str, topic: str, starts: dict[int, int], timeout: float = 30.0, **conf: Any) -> list[Rec]:
    """Read each partition of `starts` from its start offset to the end of the partition."""
    base = {"bootstrap.servers": bootstrap, "group.id": "assign-only", "enable.auto.commit": False,
            "enable.partition.eof": True, "auto.offset.reset": "error", "check.crcs": True}
    base.update(conf)
    consumer = CKConsumer(base)
    out: list[Rec] = []
    try:
        consumer.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
        pending = set(starts)
        deadline = time.monotonic() + timeout
        while pending:
            assert time.monotonic() < deadline, f"partitions {sorted(pending)} not read to the end in {timeout}s"
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == CKError._PARTITION_EOF:
                    pending.discard(msg.partition())
                    continue
                raise AssertionError(f"consumer error: {err}")
            out.append(Rec(msg.partition(), msg.offset(), msg.key(), msg.value(), norm_headers(msg.headers()),
                           msg.timestamp()[1]))
    finally:
        consumer.close()
    return sorted(out, key=lambda r: (r.partition, r.offset))


# -- kafka-python -----------------------------------------------------------------------------------------


def kp_produce(bootstrap: str, topic: str, outs: Sequence[Out], **conf: Any) -> list[tuple[int, int]]:
    from kafka import KafkaProducer

    base: dict[str, Any] = {"bootstrap_servers": bootstrap, "enable_idempotence": False, "acks": "all",
                            "linger_ms": 5}
    base.update(conf)
    producer = KafkaProducer(**base)
    try:
        futures = [
            producer.send(topic, key=o.key, value=o.value, partition=o.partition, headers=list(o.headers) or None,
                          timestamp_ms=o.timestamp)
            for o in outs
        ]
        producer.flush(30)
        metas = [f.get(timeout=30) for f in futures]
    finally:
        producer.close(timeout=10)
    return [(m.partition, m.offset) for m in metas]


def kp_consume(bootstrap: str, topic: str, starts: dict[int, int], timeout: float = 30.0, **conf: Any) -> list[Rec]:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    base: dict[str, Any] = {"bootstrap_servers": bootstrap, "group_id": None, "enable_auto_commit": False,
                            "auto_offset_reset": "none", "check_crcs": True}
    base.update(conf)
    consumer = KafkaConsumer(**base)
    out: list[Rec] = []
    try:
        tps = [KTP(topic, p) for p in starts]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, starts[tp.partition])
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, "kafka-python did not reach the end offsets"
            for _tp, msgs in consumer.poll(timeout_ms=200).items():
                for m in msgs:
                    out.append(Rec(m.partition, m.offset, m.key, m.value, norm_headers(m.headers), m.timestamp))
    finally:
        consumer.close()
    return sorted(out, key=lambda r: (r.partition, r.offset))


# -- aiokafka ---------------------------------------------------------------------------------------------


def aio_produce(bootstrap: str, topic: str, outs: Sequence[Out], **conf: Any) -> list[tuple[int, int]]:
    from aiokafka import AIOKafkaProducer

    async def run() -> list[tuple[int, int]]:
        base: dict[str, Any] = {"bootstrap_servers": bootstrap, "enable_idempotence": False, "acks": "all",
                                "linger_ms": 5}
        base.update(conf)
        producer = AIOKafkaProducer(**base)
        await producer.start()
        try:
            futures = [
                await producer.send(topic, key=o.key, value=o.value, partition=o.partition,
                                    headers=list(o.headers) or None, timestamp_ms=o.timestamp)
                for o in outs
            ]
            metas = [await f for f in futures]
        finally:
            await producer.stop()
        return [(m.partition, m.offset) if m is not None else (-1, -1) for m in metas]  # None: acks=0

    return asyncio.run(run())


def aio_consume(bootstrap: str, topic: str, starts: dict[int, int], timeout: float = 30.0, **conf: Any) -> list[Rec]:
    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as ATP

    async def run() -> list[Rec]:
        base: dict[str, Any] = {"bootstrap_servers": bootstrap, "group_id": None, "enable_auto_commit": False,
                                "auto_offset_reset": "none", "check_crcs": True}
        base.update(conf)
        consumer = AIOKafkaConsumer(**base)
        await consumer.start()
        out: list[Rec] = []
        try:
            tps = [ATP(topic, p) for p in starts]
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, starts[tp.partition])
            ends = await consumer.end_offsets(tps)
            deadline = time.monotonic() + timeout
            while True:
                positions = {tp: await consumer.position(tp) for tp in tps}
                if all(positions[tp] >= ends[tp] for tp in tps):
                    break
                assert time.monotonic() < deadline, "aiokafka did not reach the end offsets"
                batches = await consumer.getmany(timeout_ms=200)
                for _tp, msgs in batches.items():
                    for m in msgs:
                        out.append(Rec(m.partition, m.offset, m.key, m.value, norm_headers(m.headers), m.timestamp))
        finally:
            await consumer.stop()
        return sorted(out, key=lambda r: (r.partition, r.offset))

    return asyncio.run(run())


# -- kcat -------------------------------------------------------------------------------------------------


def kcat() -> str:
    path = kcat_path()
    assert path, "kcat is not installed (Debian package kcat)"
    return path


def kcat_produce(bootstrap: str, topic: str, partition: int, lines: Sequence[tuple[str | None, str]],
                 headers: Sequence[str] = (), codec: str | None = None, extra: Sequence[str] = ()) -> None:
    """One kcat -P run: each (key, value) is one line 'key<TAB>value'; key None means a keyless record."""
    args = [kcat(), "-b", bootstrap, "-P", "-t", topic, "-p", str(partition), "-K", "\t", "-Z",
            "-X", "enable.idempotence=false", "-X", "acks=all"]
    for h in headers:
        args += ["-H", h]
    if codec:
        args += ["-z", codec]
    args += list(extra)
    payload = "".join(f"{k or ''}\t{v}\n" for k, v in lines)
    proc = subprocess.run(args, input=payload.encode(), capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")


def kcat_consume(bootstrap: str, topic: str, partition: int, start: int | str = "beginning") -> list[Rec]:
    args = [kcat(), "-b", bootstrap, "-C", "-t", topic, "-p", str(partition), "-o", str(start), "-e", "-q", "-J",
            "-X", "check.crcs=true"]
    proc = subprocess.run(args, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    out = []
    for line in proc.stdout.decode().splitlines():
        if not line.strip():
            continue
        doc = json.loads(line)
        flat = doc.get("headers") or []
        headers = tuple(
            (flat[i], None if flat[i + 1] is None else flat[i + 1].encode()) for i in range(0, len(flat), 2)
        )
        key = doc["key"]
        value = doc["payload"]
        out.append(Rec(doc["partition"], doc["offset"], None if key is None else key.encode(),
                       None if value is None else value.encode(), headers, doc["ts"]))
    return out


# -- metrics ----------------------------------------------------------------------------------------------


def scrape(metrics_port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus text → {(sample name, sorted labels): value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        if "{" in head:
            name, _, rest = head.partition("{")
            labels = []
            for part in _split_labels(rest.rstrip("}")):
                k, _, v = part.partition("=")
                labels.append((k, v.strip('"')))
            key = (name, tuple(sorted(labels)))
        else:
            key = (head, ())
        samples[key] = float(value)
    return samples


def _split_labels(text: str) -> list[str]:
    parts, cur, quoted = [], [], False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if cur:
        parts.append("".join(cur))
    return parts


def metric(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload
