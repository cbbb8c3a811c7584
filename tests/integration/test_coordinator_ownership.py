"""Coordinators that own partitions of their internal topics, on a real broker over TCP.

The broker runs in this process (its own loop in a background thread, storage, listener, coordinators), so the
tests can drive the coordinators' leadership hooks exactly as cluster mode's replica manager does
(`on_resignation` / `on_leadership` on the broker's loop) while clients talk to the broker over the wire:
- a partition that is not loaded answers NOT_COORDINATOR, one that is loading COORDINATOR_LOAD_IN_PROGRESS (and
  Heartbeat NONE, SyncGroup REBALANCE_IN_PROGRESS, ListGroups/ListTransactions LOAD_IN_PROGRESS, as Kafka);
- members waiting in JoinGroup when their partition goes are answered NOT_COORDINATOR;
- a reload brings back committed offsets and group state from the log, and a confluent-kafka group resumes from
  its committed offsets and rebalances on the reloaded coordinator;
- writes name the leader epoch of their load: a load under an epoch the partition does not have cannot write;
- the transaction coordinator's ids the same way (InitProducerId, EndTxn, DescribeTransactions), its state back
  after a reload.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from kafka.protocol.admin import (
    DescribeGroupsRequest,
    DescribeTransactionsRequest,
    ListGroupsRequest,
    ListTransactionsRequest,
)
from kafka.protocol.consumer import JoinGroupRequest, OffsetFetchRequest
from kafka.protocol.metadata import FindCoordinatorRequest
from kafka.protocol.producer import EndTxnRequest, InitProducerIdRequest
from tests.integration.helpers import Out, Wire, ck_produce, create_topic
from tests.integration.test_groups_wire import commit, heartbeat, joined_member, sync

from oncelog.broker.server import Broker
from oncelog.config import load_broker_config
from oncelog.coordinator.group.store import OFFSETS_TOPIC
from oncelog.coordinator.partitioning import partition_for
from oncelog.coordinator.txn.coordinator import TXN_TOPIC
from oncelog.errors import ErrorCode as E

WAIT_S = 60  # generous: the machine is shared
OFFSETS_PARTITIONS = 3
SETTINGS = {"oncelog.fsync.enable": "false", "group.initial.rebalance.delay.ms": 0,
            "group.min.session.timeout.ms": 500, "offsets.topic.num.partitions": OFFSETS_PARTITIONS,
            "transaction.state.log.num.partitions": 3}


class Node:
    """A real broker on an event loop in a background thread; `call` runs a function on that loop."""

    def __init__(self, data_dir: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        config = load_broker_config(overrides=[f"{k}={v}" for k, v in SETTINGS.items()])
        self.broker = Broker(config, data_dir, port=0)
        self.run(self.broker.start())

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.broker.port}"

    @property
    def groups(self):
        return self.broker.group_coordinator

    @property
    def txn(self):
        return self.broker.txn_coordinator

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(WAIT_S)

    def call(self, fn, *args):
        async def run():
            return fn(*args)

        return self.run(run())

    def hold_loads(self, coordinator) -> asyncio.Event:
        """Loads of `coordinator` wait until the returned event is set (on the broker's loop)."""
        gate = self.call(asyncio.Event)

        async def held() -> None:
            await gate.wait()

        self.call(setattr, coordinator, "_load_pause", held)
        return gate

    def release(self, gate: asyncio.Event) -> None:
        self.call(gate.set)

    def stop(self) -> None:
        async def stop_all() -> None:
            await self.broker.stop()
            # Requests still in flight on connections the broker closed (a client's long poll) end here, not
            # as tasks destroyed with the loop.
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        try:
            self.run(stop_all())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(WAIT_S)
            self.loop.close()


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path / "data")
    yield n
    n.stop()


def wait_for(predicate, what: str, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.05)


def group_in_partition(p: int, prefix: str) -> str:
    return next(f"{prefix}-{i}" for i in range(1000) if partition_for(f"{prefix}-{i}", OFFSETS_PARTITIONS) == p)


def offset_fetch(w: Wire, group: str, topic: str, partitions: list[int]) -> tuple[int, dict[int, int]]:
    T = OffsetFetchRequest.OffsetFetchRequestTopic
    resp = w.request(OffsetFetchRequest(group_id=group, topics=[T(name=topic, partition_indexes=partitions)],
                                        require_stable=False), 7)
    return resp.error_code, {p.partition_index: p.committed_offset for t in resp.topics for p in t.partitions}


def join_waiting(w: Wire, group: str, member_id: str) -> int:
    """A JoinGroup whose rebalance waits a minute for the others: only something else can answer it early."""
    req = JoinGroupRequest(group_id=group, session_timeout_ms=60000, rebalance_timeout_ms=60000, member_id=member_id,
                           group_instance_id=None, protocol_type="consumer", reason=None,
                           protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"\0" * 6)])
    return w.request(req, 5).error_code


def describe(w: Wire, group: str):
    return w.request(DescribeGroupsRequest(groups=[group], include_authorized_operations=False), 5).groups[0]


def test_an_unloaded_partition_answers_not_coordinator_and_a_reload_keeps_committed_offsets(node):
    create_topic(node.bootstrap, "owned", 2)
    p = 1
    group, neighbour = group_in_partition(p, "g"), group_in_partition(0, "n")
    with Wire(node.bootstrap) as w:
        assert commit(w, group, -1, "", "owned", {0: 5, 1: 9}) == {0: E.NONE, 1: E.NONE}
        node.call(node.groups.on_resignation, OFFSETS_TOPIC, p)
        assert offset_fetch(w, group, "owned", [0, 1])[0] == E.NOT_COORDINATOR
        assert commit(w, group, -1, "", "owned", {0: 6}) == {0: E.NOT_COORDINATOR}
        assert join_waiting(w, group, "") == E.NOT_COORDINATOR
        assert describe(w, group).error_code == E.NOT_COORDINATOR
        # Groups of the other partitions are served meanwhile.
        assert commit(w, neighbour, -1, "", "owned", {0: 1}) == {0: E.NONE}
        assert offset_fetch(w, neighbour, "owned", [0]) == (E.NONE, {0: 1})
        node.call(node.groups.on_leadership, OFFSETS_TOPIC, p, 0)
        assert wait_for(lambda: offset_fetch(w, group, "owned", [0, 1])[0] == E.NONE, "the reload")
        assert offset_fetch(w, group, "owned", [0, 1]) == (E.NONE, {0: 5, 1: 9})
        assert commit(w, group, -1, "", "owned", {0: 7}) == {0: E.NONE}
        assert offset_fetch(w, group, "owned", [0]) == (E.NONE, {0: 7})


def test_a_loading_partition_answers_load_in_progress(node):
    create_topic(node.bootstrap, "loading", 1)
    p = 2
    group = group_in_partition(p, "l")
    with Wire(node.bootstrap) as w:
        member = joined_member(w, group)
        gen, mid = member.generation_id, member.member_id
        assert sync(w, group, gen, mid, {mid: b"a"}).error_code == E.NONE
        assert commit(w, group, gen, mid, "loading", {0: 3}) == {0: E.NONE}
        gate = node.hold_loads(node.groups)
        node.call(node.groups.on_resignation, OFFSETS_TOPIC, p)
        node.call(node.groups.on_leadership, OFFSETS_TOPIC, p, 0)
        assert offset_fetch(w, group, "loading", [0])[0] == E.COORDINATOR_LOAD_IN_PROGRESS
        assert join_waiting(w, group, mid) == E.COORDINATOR_LOAD_IN_PROGRESS
        assert heartbeat(w, group, gen, mid) == E.NONE  # Kafka answers blindly while loading
        assert sync(w, group, gen, mid).error_code == E.REBALANCE_IN_PROGRESS
        assert describe(w, group).error_code == E.COORDINATOR_LOAD_IN_PROGRESS
        assert w.request(ListGroupsRequest(states_filter=[], types_filter=[]), 4).error_code == \
            E.COORDINATOR_LOAD_IN_PROGRESS
        node.release(gate)
        wait_for(lambda: offset_fetch(w, group, "loading", [0])[0] == E.NONE, "the load")
        assert offset_fetch(w, group, "loading", [0]) == (E.NONE, {0: 3})
        # The member and its generation came back from the log: it goes on heartbeating.
        assert heartbeat(w, group, gen, mid) == E.NONE
        assert describe(w, group).group_state == "Stable"


def test_a_member_waiting_in_join_group_is_told_not_coordinator_when_its_partition_goes(node):
    p = 0
    group = group_in_partition(p, "w")
    with Wire(node.bootstrap) as first, Wire(node.bootstrap) as second:
        member = joined_member(first, group)
        assert sync(first, group, member.generation_id, member.member_id,
                    {member.member_id: b"a"}).error_code == E.NONE
        mid = second.request(JoinGroupRequest(
            group_id=group, session_timeout_ms=60000, rebalance_timeout_ms=60000, member_id="",
            group_instance_id=None, protocol_type="consumer", reason=None,
            protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"\0" * 6)]), 5).member_id
        answers: list[int] = []
        waiting = threading.Thread(target=lambda: answers.append(join_waiting(second, group, mid)))
        waiting.start()
        wait_for(lambda: describe(first, group).group_state == "PreparingRebalance", "the rebalance to start")
        node.call(node.groups.on_resignation, OFFSETS_TOPIC, p)
        waiting.join(WAIT_S)
        assert answers == [E.NOT_COORDINATOR]
        assert heartbeat(first, group, member.generation_id, member.member_id) == E.NOT_COORDINATOR


def test_a_load_under_another_leader_epoch_cannot_write(node):
    create_topic(node.bootstrap, "epochs", 1)
    p = 1
    group = group_in_partition(p, "e")
    with Wire(node.bootstrap) as w:
        assert commit(w, group, -1, "", "epochs", {0: 4}) == {0: E.NONE}
        # The single node leads every partition at epoch 0: a coordinator that believes it leads at epoch 1 (a
        # stale view of the partition) is refused by the partition access and answers NOT_COORDINATOR.
        node.call(node.groups.on_resignation, OFFSETS_TOPIC, p)
        node.call(node.groups.on_leadership, OFFSETS_TOPIC, p, 1)
        wait_for(lambda: offset_fetch(w, group, "epochs", [0]) == (E.NONE, {0: 4}), "the load at epoch 1")
        assert commit(w, group, -1, "", "epochs", {0: 5}) == {0: E.NOT_COORDINATOR}
        node.call(node.groups.on_resignation, OFFSETS_TOPIC, p)
        node.call(node.groups.on_leadership, OFFSETS_TOPIC, p, 0)
        wait_for(lambda: offset_fetch(w, group, "epochs", [0]) == (E.NONE, {0: 4}), "the load at epoch 0")
        assert commit(w, group, -1, "", "epochs", {0: 5}) == {0: E.NONE}


def test_a_consumer_group_keeps_its_offsets_and_rebalances_when_its_coordinator_moves(node):
    topic = "moving-group"
    create_topic(node.bootstrap, topic, 2)
    ck_produce(node.bootstrap, topic, [Out(i % 2, b"k%d" % i, b"v%d" % i) for i in range(40)])
    group = "moving"
    p = partition_for(group, OFFSETS_PARTITIONS)
    conf = {"bootstrap.servers": node.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 200,
            "partition.assignment.strategy": "range", "topic.metadata.refresh.interval.ms": 1000}
    first = Consumer(conf)
    second = None
    try:
        first.subscribe([topic])
        seen: list = []
        deadline = time.monotonic() + WAIT_S
        while len(seen) < 10:
            assert time.monotonic() < deadline, "the first consumer read nothing"
            msg = first.poll(0.2)
            if msg is not None and not msg.error():
                seen.append(msg)
        committed = {}
        for msg in seen:
            committed[msg.partition()] = max(committed.get(msg.partition(), 0), msg.offset() + 1)
        first.commit(offsets=[TopicPartition(topic, q, o) for q, o in committed.items()], asynchronous=False)
        with Wire(node.bootstrap) as w:
            before = describe(w, group)
            assert (before.group_state, len(before.members)) == ("Stable", 1)
            node.call(node.groups.on_resignation, OFFSETS_TOPIC, p)
            for _ in range(5):
                first.poll(0.1)  # its heartbeats meet NOT_COORDINATOR; it keeps looking for its coordinator
            assert offset_fetch(w, group, topic, [0, 1])[0] == E.NOT_COORDINATOR
            node.call(node.groups.on_leadership, OFFSETS_TOPIC, p, 0)
            wait_for(lambda: offset_fetch(w, group, topic, [0, 1])[0] == E.NONE, "the reload")
            assert offset_fetch(w, group, topic, [0, 1])[1] == {q: committed.get(q, -1) for q in (0, 1)}
            second = Consumer(conf)
            second.subscribe([topic])
            after: list = []

            def rebalanced() -> bool:
                for consumer in (first, second):
                    msg = consumer.poll(0.1)
                    if msg is not None and not msg.error():
                        after.append((msg.partition(), msg.offset()))
                d = describe(w, group)
                return d.group_state == "Stable" and len(d.members) == 2 and \
                    len(first.assignment()) == 1 and len(second.assignment()) == 1

            wait_for(rebalanced, "a rebalance with both consumers on the reloaded coordinator")
            remaining = {(q, o) for q in (0, 1) for o in range(committed.get(q, 0), 20)}

            def drained() -> bool:
                for consumer in (first, second):
                    msg = consumer.poll(0.1)
                    if msg is not None and not msg.error():
                        after.append((msg.partition(), msg.offset()))
                return remaining <= set(after)

            wait_for(drained, "every record after the committed offsets")
            # Nothing before a committed offset came back: the offsets survived the move.
            assert all(o >= committed.get(q, 0) for q, o in after), sorted(after)[:5]
    finally:
        first.close()
        if second is not None:
            second.close()


def init_producer(w: Wire, txn_id: str, pid: int = -1, epoch: int = -1) -> tuple[int, int, int]:
    resp = w.request(InitProducerIdRequest(transactional_id=txn_id, transaction_timeout_ms=60000, producer_id=pid,
                                           producer_epoch=epoch), 4)
    return resp.error_code, resp.producer_id, resp.producer_epoch


def test_the_transaction_coordinator_serves_only_the_partitions_it_loaded(node):
    txn_id = "moving-txn"
    p = partition_for(txn_id, 3)
    with Wire(node.bootstrap) as w:
        error, pid, epoch = init_producer(w, txn_id)
        assert error == E.NONE
        node.call(node.txn.on_resignation, TXN_TOPIC, p)
        assert init_producer(w, txn_id, pid, epoch)[0] == E.NOT_COORDINATOR
        end = w.request(EndTxnRequest(transactional_id=txn_id, producer_id=pid, producer_epoch=epoch,
                                      committed=True), 3)
        assert end.error_code == E.NOT_COORDINATOR
        described = w.request(DescribeTransactionsRequest(transactional_ids=[txn_id]), 0).transaction_states[0]
        assert described.error_code == E.NOT_COORDINATOR
        # FindCoordinator still names this broker: the single node leads the partition (a cluster names the
        # partition's leader, which loads it).
        found = w.request(FindCoordinatorRequest(key_type=1, coordinator_keys=[txn_id]), 6).coordinators[0]
        assert (found.error_code, found.node_id, found.port) == (E.NONE, 0, node.broker.port)
        gate = node.hold_loads(node.txn)
        node.call(node.txn.on_leadership, TXN_TOPIC, p, 0)
        assert init_producer(w, txn_id, pid, epoch)[0] == E.COORDINATOR_LOAD_IN_PROGRESS
        listed = w.request(ListTransactionsRequest(state_filters=[], producer_id_filters=[]), 0)
        assert listed.error_code == E.COORDINATOR_LOAD_IN_PROGRESS
        node.release(gate)
        wait_for(lambda: node.call(node.txn.owner_error, txn_id) == E.NONE, "the load")
        # The id's state came back from the log: the owner's bump is answered, not fenced.
        assert init_producer(w, txn_id, pid, epoch) == (E.NONE, pid, epoch + 1)


@pytest.mark.parametrize("version", [4, 5, 6])
def test_find_coordinator_batches_answer_this_broker_for_both_key_types(node, version):
    with Wire(node.bootstrap) as w:
        for key_type in (0, 1):
            resp = w.request(FindCoordinatorRequest(key_type=key_type, coordinator_keys=["a", "b", "c"]), version)
            assert [(c.key, c.error_code, c.node_id, c.port) for c in resp.coordinators] == [
                (k, E.NONE, 0, node.broker.port) for k in ("a", "b", "c")]
