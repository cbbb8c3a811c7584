"""Helpers of the producer's integration tests: run our producer, read back exact log contents over TCP."""

from __future__ import annotations

import threading
from typing import Any

from kafka.protocol.admin import DeleteRecordsRequest, DescribeProducersRequest
from tests.integration.helpers import Wire, fetch_raw, list_offset_raw

from oncelog.client.producer import Producer
from oncelog.records.reader import Batch, read_batches

EARLIEST, LATEST = -2, -1


class Reports:
    """Collects on_delivery reports (and the threads they ran on) in produce order."""

    def __init__(self) -> None:
        self.items: list[tuple[Any, Any]] = []
        self.threads: set[int] = set()

    def __call__(self, err: Any, msg: Any) -> None:
        self.items.append((err, msg))
        self.threads.add(threading.get_ident())

    def errors(self) -> list[Any]:
        return [e for e, _ in self.items if e is not None]

    def delivered(self) -> list[Any]:
        return [m for e, m in self.items if e is None]


def producer(bootstrap: str, **conf: Any) -> Producer:
    base: dict[str, Any] = {"bootstrap.servers": bootstrap, "linger.ms": 2}
    base.update({k.replace("_", "."): v for k, v in conf.items()})
    return Producer(base)


def log_start(bootstrap: str, topic: str, partition: int = 0) -> int:
    with Wire(bootstrap) as w:
        code, offset, _ = list_offset_raw(w, topic, partition, EARLIEST)
    assert code == 0
    return offset


def high_watermark(bootstrap: str, topic: str, partition: int = 0) -> int:
    with Wire(bootstrap) as w:
        code, offset, _ = list_offset_raw(w, topic, partition, LATEST)
    assert code == 0
    return offset


def log_batches(bootstrap: str, topic: str, partition: int = 0) -> list[Batch]:
    """Every batch of the partition from its log start to the high watermark (headers and records)."""
    out: list[Batch] = []
    with Wire(bootstrap) as w:
        offset = list_offset_raw(w, topic, partition, EARLIEST)[1]
        end = list_offset_raw(w, topic, partition, LATEST)[1]
        while offset < end:
            part = fetch_raw(w, topic, partition, offset)
            assert part.error_code == 0, part
            batches = [b for b in read_batches(part.records or b"") if b.next_offset > offset]
            assert batches, f"no progress at {offset}"
            out += batches
            offset = batches[-1].next_offset
    return out


def data_values(batches: list[Batch]) -> list[bytes | None]:
    return [r.value for b in batches if not b.is_control for r in b.records]


def delete_records(bootstrap: str, topic: str, offset: int, partition: int = 0) -> int:
    req = DeleteRecordsRequest[2]
    t = req.DeleteRecordsTopic
    with Wire(bootstrap) as w:
        resp = w.request(req(topics=[t(name=topic, partitions=[t.DeleteRecordsPartition(
            partition_index=partition, offset=offset)])], timeout_ms=10000), 2)
    (p,) = resp.topics[0].partitions
    assert p.error_code == 0, p
    return p.low_watermark


def producers_of(bootstrap: str, topic: str, partition: int = 0) -> dict[int, Any]:
    """DescribeProducers: producer id -> its state on the partition."""
    req = DescribeProducersRequest[0]
    with Wire(bootstrap) as w:
        resp = w.request(req(topics=[req.TopicRequest(name=topic, partition_indexes=[partition])]), 0)
    (t,) = resp.topics
    (p,) = t.partitions
    assert p.error_code == 0, p
    return {s.producer_id: s for s in p.active_producers}
