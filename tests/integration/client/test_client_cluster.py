"""Cluster against a real broker: metadata, leaders, auto-creation, coordinators, reconnect with backoff."""

from __future__ import annotations

import asyncio
import time

import pytest
from tests.integration.helpers import create_topic

from oncelog.client.cluster import COORDINATOR_BASE, GROUP, TRANSACTION, Cluster
from oncelog.client.config import ClientConfig
from oncelog.client.errors import KafkaError, NetworkError, RetriableError
from oncelog.errors import ErrorCode
from oncelog.protocol.apis import ApiKey


def _run(coro, timeout: float = 90.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def _cluster(broker, role: str = "producer", **conf) -> Cluster:
    return Cluster(ClientConfig({"bootstrap.servers": broker.bootstrap, **conf}, role))


def test_metadata_and_leaders(module_broker, topic_name):
    create_topic(module_broker.bootstrap, topic_name, partitions=3)

    async def scenario():
        cluster = _cluster(module_broker, "consumer")
        try:
            await cluster.bootstrap()
            assert list(cluster.brokers) == [0]
            assert (cluster.brokers[0].host, cluster.brokers[0].port) == tuple(
                module_broker.bootstrap.rsplit(":", 1)[0:1]) + (module_broker.port,)
            assert cluster.cluster_id
            # the bootstrap connection became node 0's connection: one TCP connection, not two
            assert cluster.connected_nodes() == [0] and cluster.stats["connects"] == 1
            assert cluster.partitions_for(topic_name) is None
            await cluster.refresh_metadata([topic_name])
            assert cluster.partitions_for(topic_name) == [0, 1, 2]
            assert [cluster.leader_for(topic_name, p) for p in range(3)] == [0, 0, 0]
            conn = await cluster.leader_connection(topic_name, 2)
            assert conn.node_id == 0 and not conn.closed
            # fresh metadata for known topics: nothing is sent
            sent = cluster.stats["metadata_requests"]
            await cluster.refresh_metadata([topic_name])
            assert cluster.stats["metadata_requests"] == sent
            await cluster.refresh_metadata([topic_name], force=True)
            assert cluster.stats["metadata_requests"] == sent + 1
            # concurrent forced refreshes share requests
            await asyncio.gather(*[cluster.refresh_metadata([topic_name], force=True) for _ in range(20)])
            assert cluster.stats["metadata_requests"] <= sent + 3
            with pytest.raises(RetriableError) as info:
                await cluster.leader_connection(topic_name, 7)
            assert info.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            everything = await cluster.list_all_topics()
            assert topic_name in everything and len(everything[topic_name].partitions) == 3
        finally:
            await cluster.close()
    _run(scenario())


def test_auto_create_for_producers_only(module_broker, topic_name):
    async def scenario():
        consumer = _cluster(module_broker, "consumer")
        producer = _cluster(module_broker, "producer")
        try:
            await consumer.bootstrap()
            await consumer.refresh_metadata([topic_name])
            assert consumer.topic_error(topic_name) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            assert consumer.partitions_for(topic_name) is None
            with pytest.raises(RetriableError) as info:
                await consumer.leader_connection(topic_name, 0)
            assert info.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            await producer.bootstrap()
            await producer.refresh_metadata([topic_name])
            assert producer.topic_error(topic_name) == 0 and producer.partitions_for(topic_name) == [0]
            await consumer.refresh_metadata([topic_name], force=True)
            assert consumer.partitions_for(topic_name) == [0]
        finally:
            await consumer.close()
            await producer.close()
    _run(scenario())


def test_find_coordinator_for_groups_and_transactions(module_broker):
    async def scenario():
        cluster = _cluster(module_broker)
        try:
            await cluster.bootstrap()
            group = await cluster.coordinator("g-coord", GROUP)
            txn = await cluster.coordinator("txn-coord", TRANSACTION)
            assert cluster.coordinator_id("g-coord", GROUP) == 0 and cluster.coordinator_id("txn-coord", TRANSACTION) == 0
            # coordinator traffic has its own connection to the broker, apart from the data connection
            assert group is txn and group.node_id == 0
            assert cluster._connections[COORDINATOR_BASE - 0] is group
            assert group is not await cluster.connection(0) and cluster.connected_nodes() == [0]
            asked = cluster.stats["find_coordinator_requests"]
            assert await cluster.coordinator("g-coord", GROUP) is group  # cached
            assert cluster.stats["find_coordinator_requests"] == asked
            cluster.invalidate_coordinator("g-coord", GROUP)
            assert cluster.coordinator_id("g-coord", GROUP) is None
            await cluster.coordinator("g-coord", GROUP)
            assert cluster.stats["find_coordinator_requests"] == asked + 1
            # the transaction coordinator answers a real request
            response = await cluster.coordinator_call(
                "txn-coord", TRANSACTION, ApiKey.INIT_PRODUCER_ID,
                {"transactional_id": "txn-coord", "transaction_timeout_ms": 60000,
                 "producer_id": -1, "producer_epoch": -1})
            assert response.error_code == 0 and response.producer_id >= 0 and response.producer_epoch == 0
        finally:
            await cluster.close()
    _run(scenario())


def test_reconnect_with_backoff_after_sigkill_and_coordinator_rediscovery(broker_factory, topic_name):
    broker = broker_factory()
    create_topic(broker.bootstrap, topic_name)

    async def scenario():
        cluster = _cluster(broker, "consumer", **{"group.id": "g", "reconnect.backoff.ms": 100,
                                                  "reconnect.backoff.max.ms": 800,
                                                  "socket.connection.setup.timeout.ms": 2000})
        loop = asyncio.get_running_loop()
        try:
            await cluster.bootstrap()
            await cluster.refresh_metadata([topic_name])
            coordinator = await cluster.coordinator("g-restart", GROUP)
            await loop.run_in_executor(None, broker.kill)
            await asyncio.sleep(0.2)
            assert coordinator.closed
            # each failed attempt waits a longer (jittered, capped) backoff before the next one
            attempts = []
            for _ in range(5):
                started = time.monotonic()
                with pytest.raises(NetworkError):
                    await cluster.connection(0)
                attempts.append(time.monotonic() - started)
            assert cluster.stats["connect_failures"] >= 5
            assert attempts[0] < 0.5  # the first reconnect is immediate
            assert 0.06 < attempts[1] < 0.5 and 0.12 < attempts[2] < 0.6  # 100 ms, 200 ms (±20 %)
            assert 0.5 < attempts[4] < 1.2, attempts  # capped at 800 ms
            asked = cluster.stats["find_coordinator_requests"]
            # a request to the coordinator while it is down: the failed connection makes the cluster forget
            # the coordinator, FindCoordinator is retried until the broker is back, then the request is answered
            call = asyncio.ensure_future(cluster.coordinator_call(
                "g-restart", GROUP, ApiKey.FIND_COORDINATOR, {"key": "x", "key_type": 0}, version=1,
                timeout=30))
            await asyncio.sleep(0.5)
            assert not call.done()
            await loop.run_in_executor(None, broker.start)
            response = await call
            assert response.error_code == 0
            assert cluster.stats["find_coordinator_requests"] > asked  # the coordinator was looked up again
            fresh = await cluster.coordinator("g-restart", GROUP)
            assert fresh is not coordinator and not fresh.closed
            data = await cluster.leader_connection(topic_name, 0)
            assert data is not fresh and not data.closed and data.node_id == 0
        finally:
            await cluster.close()
    _run(scenario())


def test_coordinator_call_reconnects_a_closed_coordinator_connection(module_broker):
    async def scenario():
        cluster = _cluster(module_broker, "consumer", **{"group.id": "g"})
        try:
            await cluster.bootstrap()
            conn = await cluster.coordinator("g-broken", GROUP)
            asked, connects = cluster.stats["find_coordinator_requests"], cluster.stats["connects"]
            await conn.close()
            response = await cluster.coordinator_call("g-broken", GROUP, ApiKey.LIST_GROUPS, {})
            assert response.error_code == 0
            # a closed connection to a reachable coordinator is reopened; nothing says it moved
            assert cluster.stats["connects"] == connects + 1
            assert cluster.stats["find_coordinator_requests"] == asked
        finally:
            await cluster.close()
    _run(scenario())


def test_unreachable_bootstrap_fails_with_a_network_error():
    async def scenario():
        cluster = Cluster(ClientConfig({"bootstrap.servers": "127.0.0.1:1", "request.timeout.ms": 1500,
                                        "socket.connection.setup.timeout.ms": 500}, "admin"))
        started = time.monotonic()
        with pytest.raises(NetworkError):
            await cluster.bootstrap()
        assert time.monotonic() - started < 5
        await cluster.close()
        with pytest.raises(KafkaError, match="closed"):
            await cluster.bootstrap()
    _run(scenario())


def test_not_coordinator_makes_coordinator_call_rediscover(broker_factory, topic_name, tmp_path):
    """A real NOT_COORDINATOR: failed fsyncs take the offsets partition offline, the group coordinator answers
    OffsetCommit with NOT_COORDINATOR (Kafka's mapping of a storage error), and the call keeps rediscovering the
    coordinator until the broker, restarted without the fault, takes the commit."""
    from tests.faults.storage import FsyncTrigger

    trigger = FsyncTrigger(tmp_path / "fail-fsync")
    broker = broker_factory({**trigger.setting, "offsets.topic.num.partitions": 1})
    create_topic(broker.bootstrap, topic_name)
    group = f"g-{topic_name}"

    def commit(offset: int) -> dict:
        return {"group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
                "topics": [{"name": topic_name, "partitions": [{"partition_index": 0, "committed_offset": offset,
                                                                 "committed_metadata": ""}]}]}

    def partition_error(response) -> int:
        return response.topics[0].partitions[0].error_code

    async def scenario():
        cluster = _cluster(broker, "consumer", **{"group.id": group, "retry.backoff.max.ms": 300})
        loop = asyncio.get_running_loop()
        try:
            await cluster.bootstrap()
            first = await cluster.coordinator_call(group, GROUP, ApiKey.OFFSET_COMMIT, commit(5),
                                                   error_of=partition_error)
            assert partition_error(first) == 0
            trigger.arm()
            await asyncio.sleep(1.0)  # an fsync round fails: the offsets partition goes offline
            asked = cluster.stats["find_coordinator_requests"]
            call = asyncio.ensure_future(cluster.coordinator_call(
                group, GROUP, ApiKey.OFFSET_COMMIT, commit(9), error_of=partition_error, timeout=60))
            deadline = loop.time() + 20
            while cluster.stats["coordinator_moved"] < 2 and loop.time() < deadline:
                await asyncio.sleep(0.05)
            assert cluster.stats["coordinator_moved"] >= 2 and not call.done()
            assert cluster.stats["find_coordinator_requests"] >= asked + 1  # forgotten and looked up again
            await loop.run_in_executor(None, broker.stop)
            trigger.disarm()
            await loop.run_in_executor(None, broker.start)
            response = await call
            assert partition_error(response) == 0
            fetched = await cluster.coordinator_call(
                group, GROUP, ApiKey.OFFSET_FETCH,
                {"group_id": group, "topics": [{"name": topic_name, "partition_indexes": [0]}]}, version=7)
            assert fetched.topics[0].partitions[0].committed_offset == 9
        finally:
            trigger.disarm()
            await cluster.close()
    _run(scenario())


def test_periodic_refresh_sees_new_partitions(module_broker, topic_name):
    from confluent_kafka.admin import NewPartitions
    from tests.integration.helpers import admin

    create_topic(module_broker.bootstrap, topic_name, partitions=1)

    async def scenario():
        cluster = _cluster(module_broker, "consumer", **{"metadata.max.age.ms": 300})
        loop = asyncio.get_running_loop()
        try:
            await cluster.bootstrap()
            await cluster.refresh_metadata([topic_name])
            assert cluster.partitions_for(topic_name) == [0]

            def grow():
                client = admin(module_broker.bootstrap)  # must outlive its futures
                for future in client.create_partitions([NewPartitions(topic_name, 3)]).values():
                    future.result(30)

            await loop.run_in_executor(None, grow)
            deadline = loop.time() + 10
            while cluster.partitions_for(topic_name) != [0, 1, 2] and loop.time() < deadline:
                await asyncio.sleep(0.05)  # nobody asks: the periodic refresh finds them
            assert cluster.partitions_for(topic_name) == [0, 1, 2]
        finally:
            await cluster.close()
    _run(scenario())
