"""What every replica of a partition holds, and the clients that write and read it, for tests that must show the
replicas agree after failures (a whole-cluster crash, a rolling restart, a paused leader): not only that the
current leader serves the right records.

- `Writer`: an idempotent acks=all confluent-kafka producer on a thread of its own, numbered records round-robin
  over some partitions until stopped; every delivery report kept (offset included), every error callback kept.
- `wait_isr_whole`: until every broker's Metadata shows each partition led by a live broker with all replicas in
  its ISR.
- `wait_replicas_agree`: until every replica's log has the same size (DescribeLogDirs: followers append the
  leader's batches as they are, docs/cluster.md §4.2, so equal logs have equal sizes) and the same producer state
  (DescribeProducers, which any replica answers); returns the sizes.
- `served_by_each`: each replica in turn made leader (replica order + preferred election, the way Kafka's tools
  do it) and its whole log read with confluent-kafka: only a leader serves reads, so this is how a follower's
  records are seen over the wire.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as ConfluentPartition
from kafka.admin import KafkaAdminClient
from kafka.protocol.admin import DescribeLogDirsRequest, DescribeProducersRequest
from kafka.protocol.consumer import ListOffsetsRequest
from kafka.structs import TopicPartition

from oncelog.embedded import ClusterProcess
from tests.cluster.cluster_processes import converge_s, partitions, request, wait_for

NODES = (1, 2, 3)
LOG_END = -2  # ListOffsets replica id of a debug tool: a leader answers its log end, not its high watermark


@dataclass(frozen=True, slots=True)
class Delivery:
    at: float         # time.monotonic() of the report
    partition: int
    offset: int
    value: bytes


@dataclass
class Writer:
    """Numbered records (b"%08d") to `partitions` in turn, one per `pace_s` at most, until `stop`. Records to one
    partition are numbered in increasing order, so a partition's log must hold them sorted."""
    bootstrap: str
    topic: str
    partitions: list[int]
    message_timeout_ms: int
    conf: dict[str, Any] = field(default_factory=dict)   # more producer settings
    pace_s: float = 0.003                                  # poll() wait after each record: the write rate
    acked: list[Delivery] = field(default_factory=list)
    failed: list[tuple[bytes, str]] = field(default_factory=list)
    client_errors: list[KafkaError] = field(default_factory=list)
    produced: int = 0
    remaining: int = -1           # what flush() left undelivered at the end
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _failure: BaseException | None = None

    def start(self) -> Writer:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "acks": "all",
                                 "linger.ms": 2, "message.timeout.ms": self.message_timeout_ms,
                                 "error_cb": self.client_errors.append, **self.conf})

            def report(err: KafkaError | None, msg: Any) -> None:
                if err is None:
                    self.acked.append(Delivery(time.monotonic(), msg.partition(), msg.offset(), msg.value()))
                else:
                    self.failed.append((msg.value(), str(err)))

            while not self._stop.is_set():
                value = b"%08d" % self.produced
                try:
                    producer.produce(self.topic, value=value, partition=self.partitions[self.produced % len(
                        self.partitions)], on_delivery=report)
                except BufferError:  # the local queue is full while no broker answers: wait for room
                    producer.poll(0.1)
                    continue
                self.produced += 1
                producer.poll(self.pace_s)
            self.remaining = producer.flush(self.message_timeout_ms / 1000 + 10)
        except BaseException as exc:  # noqa: BLE001 - re-raised by stop()
            self._failure = exc

    def acked_since(self, moment: float) -> int:
        return sum(1 for d in self.acked if d.at > moment)

    def stop(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(self.message_timeout_ms / 1000 + 30)
        assert not self._thread.is_alive(), "the writer did not finish its flush"
        if self._failure is not None:
            raise self._failure

    def acked_by_partition(self) -> dict[int, dict[int, bytes]]:
        out: dict[int, dict[int, bytes]] = {p: {} for p in self.partitions}
        for d in self.acked:
            out[d.partition][d.offset] = d.value
        return out


def isr_whole(c: ClusterProcess, topics: Iterable[str], via: Iterable[int] = NODES) -> bool:
    for node in via:
        for topic in topics:
            parts = partitions(c, topic, via=node)
            if not parts or any(p.leader_id == -1 or sorted(p.isr_nodes) != sorted(p.replica_nodes)
                                or p.offline_replicas for p in parts.values()):
                return False
    return True


def wait_isr_whole(c: ClusterProcess, *topics: str, via: Iterable[int] = NODES) -> None:
    nodes = tuple(via)
    wait_for(lambda: isr_whole(c, topics, nodes), f"the ISR of {topics} whole on brokers {nodes}")


def log_sizes(c: ClusterProcess, node: int, topic: str) -> dict[int, int]:
    """{partition: bytes of its log} on broker `node`, followers' replicas included."""
    d = DescribeLogDirsRequest[4]
    result = request(c, node, d(topics=None), 4).results[0]
    return {p.partition_index: p.partition_size for t in result.topics if t.name == topic for p in t.partitions}


def producer_states(c: ClusterProcess, node: int, topic: str, parts: list[int]) -> dict[int, set[tuple[int, ...]]]:
    """{partition: {(producer id, epoch, last sequence)}} as broker `node`'s replica holds them."""
    req = DescribeProducersRequest[0]
    resp = request(c, node, req(topics=[req.TopicRequest(name=topic, partition_indexes=parts)]), 0)
    out: dict[int, set[tuple[int, ...]]] = {}
    for p in resp.topics[0].partitions:
        assert p.error_code == 0, (node, p)
        out[p.partition_index] = {(s.producer_id, s.producer_epoch, s.last_sequence) for s in p.active_producers}
    return out


def wait_replicas_agree(c: ClusterProcess, topic: str, parts: list[int]) -> dict[int, int]:
    """Until every broker holds each partition's log at one size and one producer state; {partition: size}."""
    def agree() -> dict[int, int] | None:
        sizes = [log_sizes(c, n, topic) for n in NODES]
        states = [producer_states(c, n, topic, parts) for n in NODES]
        if all(s == sizes[0] for s in sizes) and sorted(sizes[0]) == parts and all(s == states[0] for s in states):
            return sizes[0]
        return None

    return wait_for(agree, f"every replica of {topic} to hold the same log and producer state")


def list_offset(c: ClusterProcess, node: int, topic: str, partition: int, replica_id: int = -1) -> tuple[int, int]:
    """ListOffsets LATEST to broker `node`: (error code, offset) — the high watermark for a client (replica id -1),
    the log end for a debug tool (-2)."""
    req = ListOffsetsRequest[7]
    lt = req.ListOffsetsTopic
    resp = request(c, node, req(replica_id=replica_id, isolation_level=0, topics=[lt(name=topic, partitions=[
        lt.ListOffsetsPartition(partition_index=partition, timestamp=-1, current_leader_epoch=-1)])]), 7)
    p = resp.topics[0].partitions[0]
    return p.error_code, p.offset


def read_log(c: ClusterProcess, topic: str, parts: list[int]) -> dict[int, list[tuple[int, bytes]]]:
    """Every record of `parts` from offset 0 up to the high watermark of the moment: {partition: [(offset, value)]}."""
    consumer = Consumer({"bootstrap.servers": c.bootstrap, "group.id": f"check-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 100, "isolation.level": "read_uncommitted"})
    try:
        # A new leader answers OFFSET_NOT_AVAILABLE until its high watermark is current: asked again until then.
        ends = {p: wait_for(lambda p=p: consumer.get_watermark_offsets(ConfluentPartition(topic, p), timeout=10,
                                                                       cached=False), "the high watermark")[1]
                for p in parts}
        consumer.assign([ConfluentPartition(topic, p, 0) for p in parts])
        got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in parts}
        deadline = time.monotonic() + converge_s()
        while any(got[p][-1][0] + 1 < ends[p] if got[p] else ends[p] > 0 for p in parts):
            assert time.monotonic() < deadline, f"could not read up to {ends}"
            for m in consumer.consume(1000, 0.5):
                assert m.error() is None, m.error()
                if m.offset() < ends[m.partition()]:
                    got[m.partition()].append((m.offset(), m.value()))
        return got
    finally:
        consumer.close()


def lead(c: ClusterProcess, admin: KafkaAdminClient, topic: str, parts: list[int], leader: int) -> None:
    """Make `leader` lead every partition of `parts` (the others keep their order after it): replica order, then a
    preferred election where it does not lead yet; returns once Metadata shows it."""
    order = [leader] + [r for r in NODES if r != leader]
    admin.alter_partition_reassignments({TopicPartition(topic, p): order for p in parts})
    wait_for(lambda: all(s.replica_nodes == order for p, s in partitions(c, topic).items() if p in parts),
             f"the replica order {order}")
    wait_isr_whole(c, topic)
    admin.elect_leaders(0, {topic: parts}, raise_errors=False)  # ELECTION_NOT_NEEDED where it leads
    wait_for(lambda: all(s.leader_id == leader for p, s in partitions(c, topic).items() if p in parts),
             f"broker {leader} to lead {topic} {parts}")


def served_by_each(c: ClusterProcess, topic: str, parts: list[int],
                   ends: dict[int, dict[int, tuple[int, int]]] | None = None,
                   ) -> dict[int, dict[int, list[tuple[int, bytes]]]]:
    """{node: read_log(...)} with `node` leading every partition in turn (its ISR whole before each move); `ends`
    gets {node: {partition: (high watermark, log end)}} as each node answered while it led."""
    admin = KafkaAdminClient(bootstrap_servers=c.bootstrap)
    served: dict[int, dict[int, list[tuple[int, bytes]]]] = {}
    try:
        for leader in NODES:
            lead(c, admin, topic, parts, leader)
            served[leader] = read_log(c, topic, parts)
            if ends is not None:  # a new leader answers OFFSET_NOT_AVAILABLE until its high watermark is current
                ends[leader] = {p: (wait_for(lambda p=p, n=leader: (r := list_offset(c, n, topic, p))[0] == 0 and r,
                                             "the high watermark")[1],
                                    list_offset(c, leader, topic, p, LOG_END)[1]) for p in parts}
    finally:
        admin.close()
    return served
